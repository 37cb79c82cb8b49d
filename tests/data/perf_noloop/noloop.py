"""No torch.optim: 4 phases of ~2 s each: busy spin, 50% sleep, O_DIRECT disk write+read, idle sleep.
Logs phase boundaries (time_ns) and own /proc truth."""
import os, sys, time, json, mmap
OUT = sys.argv[1]
def stat():
    return list(map(int, open("/proc/stat").readline().split()[1:9]))
def disk():
    for l in open("/proc/diskstats"):
        f = l.split()
        if f[2] == "vda": return int(f[5]) * 512, int(f[9]) * 512
def snap(): return {"ns": time.time_ns(), "cpu": time.process_time(), "host": stat(), "disk": disk()}
def spin_for(sec):
    end = time.process_time() + sec
    while time.process_time() < end: pass
log = []
s = snap()
spin_for(2.0); e = snap(); log.append(("busy", s, e)); s = e
for _ in range(20): spin_for(0.05); time.sleep(0.05)
e = snap(); log.append(("half", s, e)); s = e
buf = mmap.mmap(-1, 8 << 20); buf.write(os.urandom(8 << 20))
fd = os.open(OUT + ".data", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT)
for _ in range(16): os.write(fd, buf)
os.fsync(fd); os.close(fd)
fd = os.open(OUT + ".data", os.O_RDONLY | os.O_DIRECT)
while os.readv(fd, [buf]) > 0: pass
os.close(fd); os.unlink(OUT + ".data")
e = snap(); log.append(("disk", s, e)); s = e
time.sleep(2.0); e = snap(); log.append(("idle", s, e))
json.dump(log, open(OUT, "w"))
