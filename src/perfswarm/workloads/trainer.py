"""A CNN or MLP image classifier on synthetic data, with a tunable slow DataLoader.

`python -m perfswarm.workloads.trainer --steps 30 --batch-size 32 --arch cnn
--loader-delay-ms 20 --num-workers 0` is input-bound; raising --num-workers
hides the delay behind compute.
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

from perfswarm.workloads._loop import loop_args, parser, train


def cnn(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(64, classes),
    )


def mlp(classes: int, size: int) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(), nn.Linear(3 * size * size, 512), nn.ReLU(),
        nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, classes),
    )


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--arch", choices=("cnn", "mlp"), default="cnn")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--samples", type=int, default=1024, help="size of the synthetic dataset")
    ns = p.parse_args(argv)
    args = loop_args(ns)
    torch.manual_seed(args.seed)
    images = torch.randn(ns.samples, 3, ns.image_size, ns.image_size)
    labels = torch.randint(0, ns.classes, (ns.samples,))
    model = cnn(ns.classes) if ns.arch == "cnn" else mlp(ns.classes, ns.image_size)
    loss = nn.CrossEntropyLoss()
    train(args, model, TensorDataset(images, labels), lambda m, b: loss(m(b[0]), b[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
