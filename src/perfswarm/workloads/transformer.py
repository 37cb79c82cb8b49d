"""A small transformer encoder trained as a masked-token model on random token ids.

`python -m perfswarm.workloads.transformer --steps 30 --batch-size 16 --seq-len 128`
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

from perfswarm.workloads._loop import loop_args, parser, train


class Encoder(nn.Module):
    def __init__(self, vocab: int, d_model: int, heads: int, layers: int, seq_len: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Parameter(torch.zeros(1, seq_len, d_model))
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.1,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.encoder(self.tokens(ids) + self.positions))
        return out


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--samples", type=int, default=512)
    ns = p.parse_args(argv)
    args = loop_args(ns)
    torch.manual_seed(args.seed)
    ids = torch.randint(0, ns.vocab, (ns.samples, ns.seq_len))
    model = Encoder(ns.vocab, ns.d_model, ns.heads, ns.layers, ns.seq_len)
    ce = nn.CrossEntropyLoss()

    def loss(m: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        (tokens,) = batch
        masked = tokens.masked_fill(torch.rand(tokens.shape) < 0.15, 0)
        logits = m(masked)
        out: torch.Tensor = ce(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1))
        return out

    train(args, model, TensorDataset(ids), loss)
    return 0


if __name__ == "__main__":
    sys.exit(main())
