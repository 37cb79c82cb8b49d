# The lent GPU machine's side of benchmarks/gpu_check.py and gpu_sweep.py, in three verbs.
#
# Here, once:   bash benchmarks/gpu_machine.sh pack-deps
#   writes .gpu/ (ignored by git; name it in the device tool's carry): perfswarm's dependencies
#   that the machine's image lacks (orjson, msgspec, polars, duckdb, py-spy) as one xz archive of
#   their unpacked Python 3.12 wheels (about 52 MB: the wheels themselves are over the 64 MiB a
#   call carries), nanoGPT from ../shared/realworld (../shared does not travel), and the kernel
#   sweep's shapes (gpu_sweep.py shapes).
# There, first:  source benchmarks/gpu_machine.sh setup
#   unpacks them, puts src/ and them on PYTHONPATH and py-spy on PATH, prints the GPU.
# There, last:   bash benchmarks/gpu_machine.sh pack DIR NAME
#   DIR as one tar split into 15 MB parts $OUT/NAME.tar.* (at most 8 files of 16 MB come back);
#   here, `cat NAME.tar.* | tar xf -` joins them.
set -u
usage="usage: gpu_machine.sh pack-deps | setup | pack DIR NAME"
case "${1:-}" in
-h|--help)
    echo "$usage"
    ;;
pack-deps)
    set -e
    wheels=$(mktemp -d) && unpacked=$(mktemp -d)
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d "$wheels" \
        $(.venv/bin/python -m pip list --format=freeze 2>/dev/null \
          | grep -iE '^(orjson|msgspec|polars|polars-runtime-32|duckdb|py-spy)==')
    for w in "$wheels"/*.whl; do (cd "$unpacked" && unzip -q -o "$w"); done
    mkdir -p .gpu && tar -cJf .gpu/site.tar.xz -C "$unpacked" .
    [ -e .gpu/realworld ] && chmod -R u+w .gpu/realworld && rm -rf .gpu/realworld
    cp -r ../shared/realworld .gpu/realworld && chmod -R u+w .gpu/realworld
    .venv/bin/python benchmarks/gpu_sweep.py shapes .gpu/shapes.json
    rm -rf "$wheels" "$unpacked"
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >> .git/info/exclude
    du -sh .gpu
    ;;
setup)
    mkdir -p /tmp/site
    [ -e /tmp/site/polars ] || tar -xJf .gpu/site.tar.xz -C /tmp/site
    export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1
    PATH=$(echo /tmp/site/py_spy-*.data/scripts):$PATH
    export PATH
    python3 -c "import polars, duckdb, orjson, msgspec, torch; print('deps ok', torch.__version__, torch.cuda.get_device_name(0))"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
    ;;
pack)
    (cd "$2" && tar cf "/tmp/$3.tar" . && split -b 15M "/tmp/$3.tar" "$OUT/$3.tar.") && ls -la "$OUT"
    ;;
*)
    echo "$usage" >&2
    exit 2
    ;;
esac
