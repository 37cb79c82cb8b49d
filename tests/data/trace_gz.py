"""The recipes' last step: a trace they exported, gzipped as the traces here are stored (mtime
0: the same trace gives the same bytes), and the JSON removed."""
import gzip
import os
import shutil


def gzip_trace(out: str) -> None:
    """`out` (a trace's JSON) as `out`.gz, and `out` removed."""
    with open(out, "rb") as src, open(out + ".gz", "wb") as raw, \
            gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as dst:
        shutil.copyfileobj(src, dst)
    os.remove(out)
