"""The loop of encoder_fastpath_cpu.pt.trace.json.gz: an nn.TransformerEncoder (batch_first)
serving batches of 3 sequences of 10 feature vectors (width 32) under inference_mode, where
torch runs its fused fast path (aten::_transformer_encoder_layer_fwd), whose first product
multiplies the batch's tokens as rows ([30, 32]). Recorded with
`perfswarm record --steps 2:3 -c torch -- python encoder_fastpath.py` (torch 2.13 CPU)."""

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, batch_first=True)
model = nn.TransformerEncoder(layer, 2).eval()
with torch.inference_mode():
    for _ in range(8):
        model(torch.randn(3, 10, 32))
