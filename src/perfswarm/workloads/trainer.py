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


def cnn(classes: int, width: int = 16) -> nn.Module:
    """Three 3x3 convolutions of width, 2 x width and 4 x width channels."""
    w1, w2, w3 = width, 2 * width, 4 * width
    return nn.Sequential(
        nn.Conv2d(3, w1, 3, padding=1), nn.BatchNorm2d(w1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(w1, w2, 3, padding=1), nn.BatchNorm2d(w2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(w2, w3, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(w3, classes),
    )


def mlp(classes: int, size: int, width: int = 16) -> nn.Module:
    """Hidden layers of 32 x width and 16 x width units (512 and 256 by default)."""
    h1, h2 = 32 * width, 16 * width
    return nn.Sequential(
        nn.Flatten(), nn.Linear(3 * size * size, h1), nn.ReLU(),
        nn.Linear(h1, h2), nn.ReLU(), nn.Linear(h2, classes),
    )


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--arch", choices=("cnn", "mlp"), default="cnn")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--samples", type=int, default=1024, help="size of the synthetic dataset")
    p.add_argument("--width", type=int, default=16,
                   help="layer width: CNN channels width/2x/4x, MLP hidden units 32x/16x")
    ns = p.parse_args(argv)
    if ns.width < 1:
        raise SystemExit("--width must be >= 1")
    args = loop_args(ns)
    torch.manual_seed(args.seed)
    images = torch.randn(ns.samples, 3, ns.image_size, ns.image_size)
    labels = torch.randint(0, ns.classes, (ns.samples,))
    model = cnn(ns.classes, ns.width) if ns.arch == "cnn" else mlp(ns.classes, ns.image_size,
                                                                    ns.width)
    loss = nn.CrossEntropyLoss()
    train(args, model, TensorDataset(images, labels), lambda m, b: loss(m(b[0]), b[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
