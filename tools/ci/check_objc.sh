#!/usr/bin/env bash
# The Linux gate for fastmetal's Objective-C++: see tools/ci/check_objc.py (libclang from the
# `libclang` wheel; no system clang, no root). Kept as the entry point CI and docs name.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
exec "${PYTHON:-python3}" "$root/tools/ci/check_objc.py" "$@"
