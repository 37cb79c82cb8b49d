"""The loop of bucketed_eval_cpu.pt.trace.json.gz: a transformer encoder layer trained on
batches of 8 sequences whose length cycles 16, 16, 16, 128 tokens (bucketed lengths: the long
steps do 8x the work or more), AdamW, and an evaluation
(10 forwards under no_grad) after that of step 5, which lands in step 6 (of 16 tokens), the
hook's next. Recorded with
`perfswarm record --steps 1:9 -c torch -- python bucketed_eval.py` (torch 2.13 CPU)."""

import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
enc = nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True)
opt = torch.optim.AdamW(enc.parameters(), lr=1e-3)
for i in range(11):
    x = torch.randn(8, 128 if i % 4 == 3 else 16, 64)
    loss = F.mse_loss(enc(x), x)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if i == 5:
        with torch.no_grad():
            for _ in range(10):
                enc(torch.randn(8, 64, 64))
