# Sourced by the gpu-*.sh scripts, with $out (the output folder) set: records the machine in
# $out/gpu.txt and defines step. $PYTHON (default python3) runs tformer's code.
mkdir -p "$out"
py="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{
    date -u +%FT%TZ
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
    "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} > "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
# A GPU user's batch at shape B: 782 sentences of 32 target tokens, 25,024 tokens a step.
b_batch=782
# The compiled training step at shape B with that batch.
speed=(benchmarks/train_speed.py --device cuda --shapes B --batch "$b_batch" --precisions none
       --compile --repeats 5)
step() {  # step SECONDS FILE COMMAND...: run, keep its output, say how it ended
    local limit=$1 file=$2 started=$SECONDS
    shift 2
    timeout "$limit" "$@" > "$out/$file" 2>&1
    echo "$file: exit $? after $((SECONDS - started)) s"
    tail -n "${STEP_TAIL:-12}" "$out/$file"
}
# CTranslate2's PyPI wheel opens CUDA 12's cuBLAS by name: on a CUDA 13 machine, CUDA 13's
# cuBLAS is offered under those names (it ran so on an H200, 2026-11-26).
cublas=$(ls /usr/local/cuda*/lib64/libcublas*.so.13 2>/dev/null; "$py" -c 'import glob, site
print("\n".join(p for d in site.getsitepackages()
                for p in glob.glob(d + "/nvidia/**/libcublas*.so.13", recursive=True)))' 2>/dev/null)
if [ -n "$cublas" ]; then
    mkdir -p /tmp/cublas12
    for lib in $cublas; do ln -sf "$lib" "/tmp/cublas12/$(basename "$lib" .13).12"; done
    export LD_LIBRARY_PATH="/tmp/cublas12${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
