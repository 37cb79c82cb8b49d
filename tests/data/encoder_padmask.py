"""The loop of encoder_padmask_cpu.pt.trace.json.gz: encoder_fastpath.py's nn.TransformerEncoder
(batch_first, width 32) under inference_mode, its requests padded to 10 tokens and masked
(src_key_padding_mask), 2 to 5 sequences each: torch's fast path packs the valid tokens into
a nested tensor (aten::_nested_tensor_from_mask, then aten::_transformer_encoder_layer_fwd),
whose first product multiplies only those tokens as rows. Recorded with
`perfswarm record --steps 2:3 -c torch -- python encoder_padmask.py` (torch 2.13 CPU)."""

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, batch_first=True)
model = nn.TransformerEncoder(layer, 2).eval()
with torch.inference_mode():
    for batch in (2, 4, 3, 5, 2, 4, 3, 5):
        lengths = torch.arange(batch) % 4 + 4  # 4 to 7 valid tokens of 10
        mask = torch.arange(10)[None, :] >= lengths[:, None]
        model(torch.randn(batch, 10, 32), src_key_padding_mask=mask)
