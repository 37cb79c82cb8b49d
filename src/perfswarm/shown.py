"""Text from data (names, paths, commands) shown as text, wherever it is shown.

Control characters and bidirectional overrides in such text would act on what shows it: an ESC
sequence recolours a terminal or sets its title, U+202E reverses what follows it on a screen
and on a page. The terminal, the report's page and JSON printed on a terminal show them as
escapes (`\\x1b`, `\\u202e`); JSON escapes them (the same data, parsed)."""

from __future__ import annotations

import re
from typing import Final

# C0 and C1 controls but tab and newline, DEL, and the bidirectional marks, embeddings,
# overrides and isolates
_CODES: Final = [c for c in [*range(0x20), *range(0x7F, 0xA0), 0x61C, 0x200E, 0x200F,
                             *range(0x202A, 0x202F), *range(0x2066, 0x206A)] if c not in (9, 10)]
_HIDDEN: Final = {c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" for c in _CODES}
# in JSON text: those orjson leaves as they are (it escapes the C0 ones)
_RAW_IN_JSON: Final = re.compile("[" + "".join(chr(c) for c in _CODES if c >= 0x20) + "]")
# ... as orjson writes them, in UTF-8 (a lead byte is never a continuation byte, so each match
# is one whole character)
_RAW_IN_JSON_UTF8: Final = re.compile(
    b"|".join(re.escape(chr(c).encode()) for c in _CODES if c >= 0x20))


_ANY: Final = re.compile("[" + "".join(chr(c) for c in _CODES) + "]")


def visible(text: str) -> str:
    """`text` with every character that would act on what shows it written as an escape."""
    return text.translate(_HIDDEN) if _ANY.search(text) else text  # a scan, no copy


def json_escaped(text: bytes) -> bytes:
    """orjson's JSON bytes with DEL, the C1 controls and the bidirectional marks escaped too
    (\\u202e): the same data for a parser, inert on a terminal. Bytes, as orjson makes them
    and a stream writes them: a report's JSON is not copied into text and back."""
    if not _RAW_IN_JSON_UTF8.search(text):  # the common case: one scan, no copy
        return text
    return _RAW_IN_JSON_UTF8.sub(lambda m: b"\\u%04x" % ord(m.group().decode()), text)


# An escape orjson wrote for a C0 control ("\u001b", or "\b", "\f", "\r"), or an escaped
# backslash (group 1), matched whole so that what follows it is text of the data ("\\u001b"):
# read from the left, every backslash of JSON text starts an escape. Led by a literal, the
# scan skips to each backslash (a look-behind had tried every position: 0.1 s of a 200k-event
# report's 1.3 MB timeline, whose "\u003c" always sent it scanning).
_C0_ESCAPE: Final = re.compile(r"\\(?:(\\)|u00([01][0-9a-f])|([bfr]))")
_SHORT: Final = {"b": "08", "f": "0c", "r": "0d"}


def json_visible(text: str) -> str:
    """orjson's JSON text whose strings, parsed, hold `visible`'s escapes instead of control
    characters and bidirectional marks: for a page that shows the parsed text (the report's
    data), as the terminal shows it. Tab and newline stay."""
    def shown(m: re.Match[str]) -> str:
        if m.group(1):
            return m.group(0)
        code = m.group(2) or _SHORT[m.group(3)]
        return m.group(0) if code in ("09", "0a") else "\\\\x" + code
    if _C0_ESCAPE.search(text):
        text = _C0_ESCAPE.sub(shown, text)
    if _RAW_IN_JSON.search(text):
        text = _RAW_IN_JSON.sub(lambda m: "\\" + visible(m.group()), text)
    return text
