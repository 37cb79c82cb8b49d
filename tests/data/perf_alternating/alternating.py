# Recorded with `perfswarm record -c perf -- python alternating.py` into samples.parquet and
# stacks.parquet (the Run's tables); what it printed is marks.txt.
import hashlib
import time
import zlib

data = bytes(range(256)) * 4096
marks = []
def busy(fn, seconds):
    t = time.process_time()
    while time.process_time() - t < seconds:
        fn(data)
for _i in range(6):
    marks.append(time.time_ns())
    busy(lambda d: zlib.compress(d, 6), 0.15)
    busy(lambda d: hashlib.sha256(d).digest(), 0.15)
marks.append(time.time_ns())
print(*marks)
