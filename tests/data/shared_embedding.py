"""The loop of shared_embedding_cpu.pt.trace.json.gz: a sequence-to-sequence model whose encoder
and decoder look their tokens up in one shared table (as T5's `shared` embedding), 3 SGD steps
of 4 sources of 12 tokens and 4 targets of 5, 7 and 9 tokens, one forward and backward pass
each, profiled with record_shapes under a schedule (ProfilerStep markers). Written with
`python shared_embedding.py OUT.json` (torch 2.13 CPU)."""

import sys

import torch
import torch.nn.functional as F
from torch import nn
from trace_gz import gzip_trace

torch.manual_seed(0)
torch.set_num_threads(1)


class Seq2Seq(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Embedding(300, 32)
        self.encoder = nn.Linear(32, 32)
        self.decoder = nn.Linear(32, 32)
        self.head = nn.Linear(32, 300)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        memory = self.encoder(self.shared(src)).mean(1, keepdim=True)
        return self.head(self.decoder(self.shared(tgt)) + memory)


model = Seq2Seq()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                            schedule=torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1),
                            on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1])) as prof:
    for length in (3, 5, 7, 9):
        src, tgt = torch.randint(0, 300, (4, 12)), torch.randint(0, 300, (4, length))
        loss = F.cross_entropy(model(src, tgt).flatten(0, 1), tgt.flatten(), label_smoothing=0.1)
        opt.zero_grad()
        loss.backward()
        opt.step()
        prof.step()
gzip_trace(sys.argv[1])
