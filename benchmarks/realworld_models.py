"""Five small training scripts in the styles people write, at a batch size and a width.

    python benchmarks/realworld_models.py STYLE [--batch-size N] [--width W] [--steps N]

STYLE: `lstm` (a word-level LSTM language model with manual SGD and gradient clipping, as
pytorch/examples' word_language_model), `resnet` (a small ResNet with BatchNorm and SGD with
momentum), `gpt` (a GPT decoder with F.scaled_dot_product_attention, causal, and AdamW), `mixer`
(an MLP-Mixer on image patches, Adam), `conv1d` (an M5-style 1-D convolutional audio classifier on
raw waveforms, with BatchNorm, Adam). `--width` is the model's base width (embedding, hidden,
channels); each script derives its other widths from it (the GPT's and the Mixer's MLP: 4W, the
ResNet's second stage: 2W), as such scripts do. One intra-op thread by default (`--threads`), as
`perfswarm calibrate` times its sweeps. `--device cuda` runs it on a GPU (a step ends with
torch.cuda.synchronize(), so its time is the GPU's too). No perfswarm import:
benchmarks/realworld.py records this script unmodified at several configurations and predicts each
from one. The ground truth it prints last, one JSON line after `truth `: per step, from the end of
one to the end of the next (as the recorder's hooks time it), the wall time (`step_ns`) and the
process's CPU time (`cpu_ns`): on a machine other processes share, a step's wall time holds the
time the process waited for a core, its CPU time does not.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch import nn

STYLES = ("lstm", "resnet", "gpt", "mixer", "conv1d")


class Block(nn.Module):
    """A ResNet basic block: two 3x3 convolutions with BatchNorm, a projected shortcut where
    the channels change."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn1, self.bn2 = nn.BatchNorm2d(c_out), nn.BatchNorm2d(c_out)
        self.short = (nn.Sequential(nn.Conv2d(c_in, c_out, 1, bias=False), nn.BatchNorm2d(c_out))
                      if c_in != c_out else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.short(x))


class Decoder(nn.Module):
    """A GPT block: causal self-attention through scaled_dot_product_attention, a 4W MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp(self.ln2(x))


class Mixer(nn.Module):
    """An MLP-Mixer layer: an MLP across the tokens, then one across the channels (4W)."""

    def __init__(self, tokens: int, width: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.tokens = nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(),
                                    nn.Linear(2 * tokens, tokens))
        self.channels = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                      nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.tokens(self.ln1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channels(self.ln2(x))


def build(style: str, w: int) -> tuple[nn.Module, tuple[int, ...], int]:
    """The model, one sample's input shape (integer token ids for the language models), and
    the number of classes (vocabulary)."""
    if style == "lstm":
        class LM(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.emb, self.rnn = nn.Embedding(500, w), nn.LSTM(w, w, 2)
                self.out = nn.Linear(w, 500)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.out(self.rnn(self.emb(x))[0])

        return LM(), (35,), 500
    if style == "resnet":
        return nn.Sequential(nn.Conv2d(3, w, 3, padding=1, bias=False), nn.BatchNorm2d(w),
                             nn.ReLU(), Block(w, w), nn.MaxPool2d(2), Block(w, 2 * w),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * w, 10)
                             ), (3, 16, 16), 10
    if style == "gpt":
        class GPT(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.tok, self.pos = nn.Embedding(256, w), nn.Parameter(torch.zeros(64, w))
                self.blocks = nn.Sequential(Decoder(w, 4), Decoder(w, 4))
                self.ln, self.head = nn.LayerNorm(w), nn.Linear(w, 256, bias=False)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.head(self.ln(self.blocks(self.tok(x) + self.pos)))

        return GPT(), (64,), 256
    if style == "mixer":
        class MLPMixer(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.patch = nn.Conv2d(3, w, 8, stride=8)  # 32x32 images, 16 patches of 8x8
                self.layers = nn.Sequential(Mixer(16, w), Mixer(16, w))
                self.head = nn.Linear(w, 10)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                tokens = self.patch(x).flatten(2).transpose(1, 2)
                return self.head(self.layers(tokens).mean(dim=1))

        return MLPMixer(), (3, 32, 32), 10
    return nn.Sequential(nn.Conv1d(1, w, 80, stride=16), nn.BatchNorm1d(w), nn.ReLU(),
                         nn.MaxPool1d(4), nn.Conv1d(w, w, 3, padding=1), nn.BatchNorm1d(w),
                         nn.ReLU(), nn.MaxPool1d(4), nn.Conv1d(w, 2 * w, 3, padding=1),
                         nn.BatchNorm1d(2 * w), nn.ReLU(), nn.AdaptiveAvgPool1d(1),
                         nn.Flatten(), nn.Linear(2 * w, 10)), (1, 4000), 10


def optimizer(style: str, net: nn.Module) -> torch.optim.Optimizer | None:
    """The script's optimizer of `net` (none for the LSTM LM, which trains by hand)."""
    return {
        "resnet": lambda: torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9),
        "gpt": lambda: torch.optim.AdamW(net.parameters(), lr=1e-3),
        "mixer": lambda: torch.optim.Adam(net.parameters(), lr=1e-3),
        "conv1d": lambda: torch.optim.Adam(net.parameters(), lr=1e-3),
    }.get(style, lambda: None)()


def train_step(style: str, net: nn.Module, opt: torch.optim.Optimizer | None,
               shape: tuple[int, ...], classes: int, batch: int, dev: torch.device) -> None:
    """One training step of `style` at `batch`: a fresh random batch, forward, loss, backward
    and the optimizer's step (the LSTM LM's by hand: clipping, then SGD)."""
    if style in ("lstm", "gpt"):  # token ids: the LSTM's [sequence, batch], the GPT's transposed
        x = torch.randint(0, classes, (*shape, batch) if style == "lstm" else (batch, *shape),
                          device=dev)
        target = torch.randint(0, classes, x.shape, device=dev)
    else:
        x = torch.randn(batch, *shape, device=dev)
        target = torch.randint(0, classes, (batch,), device=dev)
    out = net(x)
    loss = F.cross_entropy(out.reshape(-1, classes), target.reshape(-1))
    if opt is None:  # word_language_model's loop: manual SGD after clipping
        net.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(net.parameters(), 0.25)
        with torch.no_grad():
            for w in net.parameters():
                w.add_(w.grad, alpha=-0.1)  # type: ignore[arg-type]
    else:
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("style", choices=STYLES)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--width", type=int, default=40)
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    ns = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(ns.threads)
    dev = torch.device(ns.device)
    net, shape, classes = build(ns.style, ns.width)
    net.to(dev)
    opt = optimizer(ns.style, net)
    wall, cpu = [], []
    last = time.perf_counter_ns(), time.process_time_ns()
    for _ in range(ns.steps):
        train_step(ns.style, net, opt, shape, classes, ns.batch_size, dev)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        now = time.perf_counter_ns(), time.process_time_ns()
        wall.append(now[0] - last[0])
        cpu.append(now[1] - last[1])
        last = now
    print("truth " + json.dumps({"step_ns": wall, "cpu_ns": cpu}))


if __name__ == "__main__":
    main()
