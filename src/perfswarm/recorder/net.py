"""Network flows (opt-in): tcpdump captures packet headers on every interface, loopback included
(ranks on one host talk over lo); each flow's bytes and packets become counters.

tcpdump writes a pcap (`-s 160`: headers only, `--time-stamp-precision nano`,
kernel timestamps on the epoch clock, so no offset). It captures the whole
host, not just the child's processes, so it starts before the child, and
`-U --immediate-mode` hands each packet to the file as it arrives, so a
crash or Ctrl-C loses none. The pcap is read here directly (the format is a
24-byte header and a 16-byte header per packet) rather than by a second
tcpdump pass over text.

A flow is one direction of a conversation: `net.flow.<proto>.<src>:<port>-><dst>:<port>`
(IPv6 addresses in brackets; protocols without ports have none), with
`.bytes` (TCP/UDP payload: what the application sent, retransmissions again)
and `.packets`, cumulative since the capture began, one point per flow and
interval (1/--hz) it was active, stamped with that interval's last packet.
"""

from __future__ import annotations

import getpass
import re
import time

from perfswarm.recorder.tools import ToolCollector

SNAPLEN = 160  # link (20) + IPv6 (40) and its extension headers + TCP with options (60)
READY_S = 10.0  # how long tcpdump may take to open the capture before the child starts
_DROPPED = re.compile(r"(\d+) packets? dropped by kernel")


class NetCollector(ToolCollector):
    name = "net"
    tool = "tcpdump"
    output = "net.pcap"

    def argv(self, pid: int) -> list[str]:
        assert self.exe is not None
        # -Z: run as ourselves; as root tcpdump would otherwise switch to its own user, who
        # cannot write into the private recording directory.
        return [self.exe, "-i", "any", "-n", "-s", str(SNAPLEN), "-U", "--immediate-mode",
                "--time-stamp-precision", "nano", "-Z", getpass.getuser(),
                "-w", str(self.raw / self.output)]

    def before_child(self) -> None:
        """Start capturing before the child runs (it needs no pid), and wait until tcpdump says
        it is listening, so the child's first packets are in the capture."""
        if self.exe is None:
            return
        self.launch(self.argv(0))
        deadline = time.monotonic() + READY_S
        while self.proc is not None and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.unavailable(self._reason())
                self.proc = None
            elif "listening on" in self.log.read_text(errors="replace"):
                return
            else:
                time.sleep(0.01)

    def start(self, pid: int) -> None:
        """Already capturing since `before_child`."""

    def clock_offset(self, monotonic_offset: int) -> int | None:
        return 0  # pcap timestamps are epoch time

    def dropped(self) -> int:
        """Packets the kernel dropped (tcpdump's closing line): the counts are short by them."""
        m = _DROPPED.search(self.log.read_text(errors="replace")) if self.log.exists() else None
        return int(m.group(1)) if m else 0
