"""A pcap capture (recorder/net.py's tcpdump, nanosecond timestamps on the epoch clock) read
directly: a 24-byte header, then a 16-byte header per packet. Each flow (one direction of a
conversation) becomes cumulative `.bytes` and `.packets` counters, one point per interval."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from perfswarm.errors import TraceFormatError
from perfswarm.trace.readers.fields import Placement, Row, SideTables, counter_table

ARPHRD_LOOPBACK = 772
PACKET_OUTGOING = 4
_PROTO = {6: "tcp", 17: "udp", 1: "icmp", 58: "icmpv6"}
_IPV6_EXTENSIONS = frozenset({0, 43, 44, 60})  # hop-by-hop, routing, fragment, dest. options


class Packet(NamedTuple):
    ts_ns: int
    proto: str
    src: str
    sport: int  # -1: no ports (not TCP/UDP, or a later IP fragment)
    dst: str
    dport: int
    payload: int  # TCP/UDP payload bytes; for other protocols the IP payload


def _link(linktype: int) -> tuple[int, int, int, int]:
    """(header length, offset of the ethertype, of the ARPHRD type, of the packet type); -1 where
    the link header has none."""
    if linktype == 113:  # LINUX_SLL (cooked v1)
        return 16, 14, 2, 1
    if linktype == 276:  # LINUX_SLL2
        return 20, 0, 8, 10
    if linktype == 1:  # Ethernet
        return 14, 12, -1, -1
    if linktype in (12, 101):  # raw IP
        return 0, -1, -1, -1
    raise ValueError(f"link type {linktype} is not supported (tcpdump -i any writes 113 or 276)")


def read_pcap(data: bytes, path: Path) -> Iterator[Packet]:
    """The IPv4/IPv6 packets of a pcap file; a record cut off by a crash ends the file."""
    if len(data) < 24:
        return  # tcpdump stopped before writing its header
    magic = data[:4]
    order = {b"\xa1\xb2\xc3\xd4": ">", b"\xd4\xc3\xb2\xa1": "<",
             b"\xa1\xb2\x3c\x4d": ">", b"\x4d\x3c\xb2\xa1": "<"}.get(magic)
    if order is None:
        raise TraceFormatError(path, "byte 0", "not a pcap file (pcapng is not read)")
    frac_ns = 1 if magic in (b"\xa1\xb2\x3c\x4d", b"\x4d\x3c\xb2\xa1") else 1000
    try:
        hlen, eth_at, hatype_at, pkttype_at = _link(struct.unpack(order + "I", data[20:24])[0])
    except ValueError as e:
        raise TraceFormatError(path, "header", str(e)) from None
    record = struct.Struct(order + "IIII")
    pos = 24
    while pos + 16 <= len(data):
        sec, frac, incl, orig = record.unpack_from(data, pos)
        pos += 16
        if pos + incl > len(data):
            return
        frame = data[pos:pos + incl]
        pos += incl
        if hatype_at >= 0 and len(frame) >= hlen:
            loopback = int.from_bytes(frame[hatype_at:hatype_at + 2], "big") == ARPHRD_LOOPBACK
            if loopback and frame[pkttype_at] == PACKET_OUTGOING:
                continue  # lo shows a packet going out and coming in: count it once
        ethertype = int.from_bytes(frame[eth_at:eth_at + 2], "big") if eth_at >= 0 else -1
        packet = _ip(frame[hlen:], orig - hlen, ethertype, sec * 1_000_000_000 + frac * frac_ns)
        if packet is not None:
            yield packet


def _ip(ip: bytes, length: int, ethertype: int, ts: int) -> Packet | None:
    """One IP packet's flow and payload; `length` is its size from the capture record, for
    segmentation-offload packets whose length field says 0."""
    if not ip:
        return None
    version = ip[0] >> 4
    if version == 4 and ethertype in (0x0800, -1) and len(ip) >= 20:
        ihl = (ip[0] & 0x0F) * 4
        total = int.from_bytes(ip[2:4], "big") or length
        proto, l4 = ip[9], ihl
        first_fragment = int.from_bytes(ip[6:8], "big") & 0x1FFF == 0
        src, dst = socket.inet_ntop(socket.AF_INET, ip[12:16]), socket.inet_ntop(
            socket.AF_INET, ip[16:20])
    elif version == 6 and ethertype in (0x86DD, -1) and len(ip) >= 40:
        total = (int.from_bytes(ip[4:6], "big") + 40) if ip[4:6] != b"\0\0" else length
        proto, l4, first_fragment = ip[6], 40, True
        while proto in _IPV6_EXTENSIONS and l4 + 8 <= len(ip):
            if proto == 44:  # fragment header: later fragments carry no ports
                first_fragment = int.from_bytes(ip[l4 + 2:l4 + 4], "big") & 0xFFF8 == 0
                proto, l4 = ip[l4], l4 + 8
            else:
                proto, l4 = ip[l4], l4 + (ip[l4 + 1] + 1) * 8
        src = "[" + socket.inet_ntop(socket.AF_INET6, ip[8:24]) + "]"
        dst = "[" + socket.inet_ntop(socket.AF_INET6, ip[24:40]) + "]"
    else:
        return None
    name = _PROTO.get(proto, f"ip{proto}")
    if first_fragment and proto == 6 and len(ip) >= l4 + 13:
        header = (ip[l4 + 12] >> 4) * 4
        sport, dport = struct.unpack_from(">HH", ip, l4)
        return Packet(ts, name, src, sport, dst, dport, max(0, total - l4 - header))
    if first_fragment and proto == 17 and len(ip) >= l4 + 8:
        sport, dport = struct.unpack_from(">HH", ip, l4)
        return Packet(ts, name, src, sport, dst, dport, max(0, total - l4 - 8))
    return Packet(ts, name, src, -1, dst, -1, max(0, total - l4))


def flow_name(p: Packet) -> str:
    if p.sport < 0:
        return f"net.flow.{p.proto}.{p.src}->{p.dst}"
    return f"net.flow.{p.proto}.{p.src}:{p.sport}->{p.dst}:{p.dport}"


def flow_rows(packets: Iterator[Packet], interval_ns: int) -> list[Row]:
    """Per flow, one point per interval it was active: cumulative bytes and packets. The
    packets' point is stamped with the interval's last packet, the bytes' with its last that
    carried a payload (a close's empty FIN and ACKs after the data had stamped the bytes' total
    past the receiver having it all), else with its last. Intervals are fixed slices of the
    epoch clock."""
    totals: dict[str, list[int]] = {}  # flow -> [bytes, packets]
    # (flow, interval) -> the last packet's ts, the last payload's ts, bytes, packets
    points: dict[tuple[str, int], tuple[int, int | None, int, int]] = {}
    for p in packets:
        flow = flow_name(p)
        total = totals.setdefault(flow, [0, 0])
        total[0] += p.payload
        total[1] += 1
        key = flow, p.ts_ns // interval_ns
        carried = p.ts_ns if p.payload else points[key][1] if key in points else None
        points[key] = (p.ts_ns, carried, total[0], total[1])
    rows: list[Row] = []
    for (flow, _), (ts, carried, nbytes, count) in points.items():
        rows += [(ts if carried is None else carried, flow + ".bytes", -1, float(nbytes)),
                 (ts, flow + ".packets", -1, float(count))]
    return rows


def read(path: Path, at: Placement) -> SideTables:
    """A capture file's flows as counters, a point per sampling interval (none when there is
    no file)."""
    if not path.is_file():
        return SideTables("pcap")
    return SideTables("pcap", counters=counter_table(
        flow_rows(read_pcap(path.read_bytes(), path), at.interval_ns)))
