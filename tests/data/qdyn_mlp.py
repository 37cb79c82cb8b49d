"""The loop of qdyn_mlp_cpu.pt.trace.json.gz: an MLP whose nn.Linear layers
torch.ao.quantization.quantize_dynamic made int8 (quantized::linear_dynamic, which no cost
model prices), serving requests of 1 to 16 rows under no_grad. Recorded with
`perfswarm record --steps 2:3 -c torch -- python qdyn_mlp.py` (torch 2.13 CPU); the Run's
counters held the recorder's `step batch` of each request."""

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).eval()
quantized = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
with torch.no_grad():
    for batch in (1, 4, 16, 8, 1, 4, 16, 8):
        quantized(torch.randn(batch, 64))
