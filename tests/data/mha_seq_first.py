"""An nn.TransformerEncoder with batch_first=False (nn.MultiheadAttention's default): a batch of
6 sequences of 20 tokens, width 32, 4 heads of 8, 4 steps, the last two profiled with shapes:
tests/data/mha_seq_first.json.gz was written by `python tests/data/mha_seq_first.py
tests/data/mha_seq_first.json` (then gzip -9). Its tensors lead with the sequence ([20, 6,
32]); attention takes q, k and v as views of them, [6, 4, 20, 8] with strides (32, 8, 192,
1): rows 6 x 32 apart."""
import sys

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0)
model = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(20, 6, 32)
with torch.profiler.profile(
        record_shapes=True, schedule=torch.profiler.schedule(wait=0, warmup=2, active=2, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1])) as prof:
    for _ in range(4):
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        prof.step()
