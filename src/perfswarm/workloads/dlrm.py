"""A DLRM-like recommender: sparse features through EmbeddingBags, dense through an MLP,
pairwise dot-product interaction, then a top MLP to a click probability.

`python -m perfswarm.workloads.dlrm --steps 30 --batch-size 128 --tables 8 --rows 100000`
"""

from __future__ import annotations

import itertools
import sys

import torch
from torch import nn
from torch.utils.data import Dataset

from perfswarm.workloads._loop import loop_args, parser, train


def _mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class DLRM(nn.Module):
    def __init__(self, dense: int, tables: int, rows: int, dim: int, sparse: bool = True) -> None:
        super().__init__()
        # sparse gradients, as recommenders train: a dense one zero-fills the whole table
        # every step (and the OS must hand out its pages afresh)
        self.embeddings = nn.ModuleList(
            nn.EmbeddingBag(rows, dim, mode="sum", sparse=sparse) for _ in range(tables))
        self.bottom = _mlp([dense, 256, 128, dim])
        pairs = (tables + 1) * tables // 2
        self.top = _mlp([dim + pairs, 256, 128, 1])

    def forward(self, dense: torch.Tensor, indices: torch.Tensor,
                offsets: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        # indices/offsets: (tables, batch*pooling) and (tables, batch), one row per table
        sparse = [emb(indices[t], offsets[t]) for t, emb in enumerate(self.embeddings)]
        feats = torch.stack([x, *sparse], dim=1)
        dots = torch.bmm(feats, feats.transpose(1, 2))
        i, j = torch.tril_indices(feats.shape[1], feats.shape[1], offset=-1)
        out: torch.Tensor = self.top(torch.cat([x, dots[:, i, j]], dim=1))
        return out.squeeze(1)


class ClickLog(Dataset[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]):
    """Synthetic samples: dense floats, `pooling` ids per table (power-law-ish), a label."""

    def __init__(self, n: int, dense: int, tables: int, rows: int, pooling: int,
                 seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.dense = torch.randn(n, dense, generator=g)
        skew = torch.rand(n, tables, pooling, generator=g) ** 3  # hot rows are frequent
        self.ids = (skew * rows).long()
        self.labels = torch.randint(0, 2, (n,), generator=g).float()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.dense[i], self.ids[i], self.labels[i]


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--dense", type=int, default=13)
    p.add_argument("--tables", type=int, default=8)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--pooling", type=int, default=20, help="ids per sample and table")
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--dense-grads", action="store_true",
                   help="dense embedding gradients (each step writes every table row)")
    ns = p.parse_args(argv)
    args = loop_args(ns)
    torch.manual_seed(args.seed)
    model = DLRM(ns.dense, ns.tables, ns.rows, ns.dim, sparse=not ns.dense_grads)
    data = ClickLog(ns.samples, ns.dense, ns.tables, ns.rows, ns.pooling, args.seed)
    bce = nn.BCEWithLogitsLoss()

    def loss(m: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        dense, ids, labels = batch
        b = ids.shape[0]
        indices = ids.permute(1, 0, 2).reshape(ns.tables, b * ns.pooling)
        offsets = torch.arange(0, b * ns.pooling, ns.pooling).expand(ns.tables, b)
        out: torch.Tensor = bce(m(dense, indices, offsets), labels)
        return out

    train(args, model, data, loss)
    return 0


if __name__ == "__main__":
    sys.exit(main())
