#!/usr/bin/env bash
# Set up the development environment and run the demo or the tests.
#
#   bash scripts/dev.sh demo [diffsim-demo args...]   set up, then run diffsim-demo
#   bash scripts/dev.sh test [pytest args...]         set up, then run the tests:
#       no test named (only options such as -x or -k EXPR): the whole suite with them,
#         in one pytest-xdist worker per core (at most 4; files kept whole on a worker;
#         -n 0 runs it in one process);
#       test files, folders or node ids (test/test_robots.py::test_x): only those, in one
#         process
#   bash scripts/dev.sh setup                         set up only
#
# Set-up creates a virtual environment (default: .venv at the repository root; override
# with DIFFSIM_VENV=/some/path) and installs torch (CPU, pinned), the requirements*.txt
# files and this package in editable mode.  A stamp file holding a hash of the
# requirements makes re-runs skip the installs.
#
# Environment:
#   DIFFSIM_VENV         virtual environment path (default: <repo>/.venv)
#   DIFFSIM_PYTHON       interpreter that creates it (default: python3)
#   DIFFSIM_TORCH_INDEX  index URL for the torch install only, for machines whose pip
#                        would otherwise pick a CUDA build, e.g.
#                        https://download.pytorch.org/whl/cpu
#   DIFFSIM_DRY_RUN      if set: skip the set-up and print the command that would run,
#                        one argument per line, instead of running it
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${DIFFSIM_VENV:-$repo/.venv}
python=${DIFFSIM_PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1

log() { echo "[dev.sh] $*" >&2; }

# A ROS 2 distribution counts as sourced when ROS_DISTRO is set and the system
# interpreter imports its rclpy; the venv then sees it through --system-site-packages
# and the Kilted PyPI wheels are not installed.
ros_sourced() {
  [ -n "${ROS_DISTRO:-}" ] && "$python" -c 'import rclpy' >/dev/null 2>&1
}

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

create_venv() {
  if [ -e "$venv" ]; then
    log "$venv exists but holds no virtual environment (no bin/python);" \
      "remove it or point DIFFSIM_VENV elsewhere"
    exit 1
  fi
  local opts=()
  if ros_sourced; then
    log "ROS 2 $ROS_DISTRO is sourced: the venv will use its rclpy (--system-site-packages)"
    opts+=(--system-site-packages)
  fi
  if ! "$python" -m venv "${opts[@]}" "$venv"; then
    # Debian and Ubuntu ship the venv module separately.  The half-made venv was
    # created by this run (checked above), so it is safe to remove.
    if command -v apt-get >/dev/null 2>&1; then
      rm -rf "$venv"
      local minor
      minor=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
      log "installing python3-venv with apt-get"
      as_root apt-get update -q
      as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        python3-venv "python$minor-venv" \
        || as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv
      "$python" -m venv "${opts[@]}" "$venv"
    else
      log "'$python -m venv' failed; install the venv module for $python and re-run"
      exit 1
    fi
  fi
}

setup() {
  [ -x "$venv/bin/python" ] || { log "creating $venv"; create_venv; }
  local pip=("$venv/bin/python" -m pip)
  local ros_mode=wheels
  if ros_sourced; then
    ros_mode="system:$ROS_DISTRO"
    grep -q '^include-system-site-packages = true' "$venv/pyvenv.cfg" \
      || log "warning: $venv was made without --system-site-packages and cannot see" \
        "ROS 2 $ROS_DISTRO's rclpy; delete it and re-run"
  fi

  # Everything that decides what gets installed goes into the stamp.
  local stamp=$venv/.diffsim-stamp hash
  hash=$(cd "$repo" && {
    cat requirements-torch.txt requirements.txt requirements-ros.txt setup.py setup.cfg
    echo "$ros_mode ${DIFFSIM_TORCH_INDEX:-}"
  } | sha256sum | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$hash" ] && [ -x "$venv/bin/diffsim-demo" ]; then
    return 0
  fi

  log "installing requirements into $venv (first run or requirements changed)"
  rm -f "$stamp"
  # pip >= 25.3 has no legacy 'setup.py develop' path: that path would obey setup.cfg's
  # ROS script_dir and hide the console scripts in $venv/lib/diffsim_ros.
  "${pip[@]}" install -q --upgrade 'pip>=25.3'
  # torch first and alone, then everything else constrained to that exact build.
  local torch_index=()
  if [ -n "${DIFFSIM_TORCH_INDEX:-}" ]; then torch_index=(--index-url "$DIFFSIM_TORCH_INDEX"); fi
  "${pip[@]}" install -q "${torch_index[@]}" -r "$repo/requirements-torch.txt"
  "${pip[@]}" install -q -c "$repo/requirements-torch.txt" -r "$repo/requirements.txt"
  if [ "$ros_mode" = wheels ]; then
    "${pip[@]}" install -q -c "$repo/requirements-torch.txt" -r "$repo/requirements-ros.txt"
  fi
  # --no-deps: setup.py's install_requires must never pull a torch build of its own.
  "${pip[@]}" install -q --no-deps --no-build-isolation -e "$repo"
  if [ ! -x "$venv/bin/diffsim-demo" ]; then
    log "pip did not put diffsim-demo into $venv/bin"
    exit 1
  fi
  echo "$hash" >"$stamp"
  log "environment ready"
}

# True when the pytest arguments name tests (a path or node id), not only options.  The
# values of pytest's options that take a separate one (-k EXPR, -m MARK, ...) are skipped:
# `-k test` must not read as the folder test/.
names_tests() {
  local skip_value=0 positional=0 arg
  for arg in "$@"; do
    if [ "$skip_value" = 1 ]; then skip_value=0; continue; fi
    if [ "$positional" = 1 ]; then return 0; fi
    case "$arg" in
      --) positional=1 ;;
      -k|-m|-p|-o|-c|-W|-n|-r|--deselect|--ignore|--ignore-glob|--rootdir|--basetemp|\
      --durations|--maxfail|--tb|--junitxml|--junit-xml|--log-level|--confcutdir|\
      --override-ini|--timeout|--import-mode|--capture|--color) skip_value=1 ;;
      -*) ;;
      *) return 0 ;;
    esac
  done
  return 1
}

run() {
  if [ -n "${DIFFSIM_DRY_RUN:-}" ]; then
    printf '%s\n' "$@"
    exit 0
  fi
  exec "$@"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
[ -n "${DIFFSIM_DRY_RUN:-}" ] && setup() { :; }
case "$cmd" in
  setup)
    setup
    ;;
  demo)
    setup
    run "$venv/bin/diffsim-demo" "$@"
    ;;
  test)
    setup
    cd "$repo"
    if names_tests "$@"; then
      run "$venv/bin/python" -m pytest "$@"
    fi
    # The whole suite: most tests are one busy thread (conftest sets OMP_NUM_THREADS=1),
    # so a worker per core divides the time.  Whole files per worker keep module
    # fixtures built once; DDS tests reserve their own domain (test/ros_helpers.py).
    # More than 4 workers would mostly add memory (a worker holds torch, rclpy, MuJoCo).
    # (nproc would answer OMP_NUM_THREADS where it is set, not the cores.)
    workers=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 1)
    [ "$workers" -gt 4 ] && workers=4
    parallel=()
    [ "$workers" -gt 1 ] && parallel=(-n "$workers" --dist loadfile)
    run "$venv/bin/python" -m pytest test "${parallel[@]}" "$@"
    ;;
  *)
    echo "usage: bash scripts/dev.sh {demo|test|setup} [args...]" >&2
    exit 2
    ;;
esac
