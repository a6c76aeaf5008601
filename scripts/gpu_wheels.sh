#!/usr/bin/env bash
# Fetch, on a machine with a package index, the wheels of tessera-lab's runtime dependencies that a GPU machine's
# Python may lack, into .whl/ (git-ignored); scripts/gpu_check.sh installs them from there (no index needed there).
#
#   scripts/gpu_wheels.sh [PYTHON_VERSION]     (default 3.12: the lent GPU machines' python3)
#
# Only packages pyproject.toml lists that such a machine's image does not hold are fetched (today: highspy, the
# ILP partitioner's solver); everything else the check imports (numpy, pandas, matplotlib, seaborn, tqdm, filelock,
# torch) is expected there and checked by gpu_check.sh before any step.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ver="${1:-3.12}"
case "$ver" in 3.[0-9]|3.[0-9][0-9]) ;; *) echo "gpu_wheels.sh: python version = '$ver' is not allowed; allowed: 3.N, e.g. 3.12" >&2; exit 2;; esac
py="$(command -v python3 || command -v python)"
mkdir -p "$here/.whl"
plats=()
for n in 17 24 27 28 31 34; do plats+=(--platform "manylinux_2_${n}_x86_64"); done
"$py" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: --python-version "$ver" \
  --implementation cp "${plats[@]}" --platform manylinux2014_x86_64 -d "$here/.whl" highspy
ls -l "$here/.whl"
echo "next: copy .whl/ (git-ignored) with the checkout to the GPU machine, whose python -V must be $ver, and run" \
  "OUT=/path/to/results scripts/gpu_check.sh there"
