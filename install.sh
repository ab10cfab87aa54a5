#!/bin/sh
# Install GPUlayer for this user, without sudo: a private virtual environment, and the `gpulayer`
# command linked into a folder on PATH. Run it again to upgrade.
#
#   sh install.sh                      the latest release
#   sh install.sh --version 0.4.0      that release
#   sh install.sh --from PATH          a wheel, or a source folder (a checkout)
#   sh install.sh --extra torch        with an extra (torch: the PyTorch Trainer)
#   sh install.sh --uninstall          remove what it installed (your ~/.gpulayer home stays)
#
# GPULAYER_INSTALL_DIR (default ~/.local/share/gpulayer) holds the environment, GPULAYER_BIN_DIR
# (default ~/.local/bin) the link; PYTHON (default python3) is the interpreter it is made with.
set -eu

install_dir="${GPULAYER_INSTALL_DIR:-$HOME/.local/share/gpulayer}"
bin_dir="${GPULAYER_BIN_DIR:-$HOME/.local/bin}"
python="${PYTHON:-python3}"
version=""
source=""
extra=""
action="install"

fail() {
    echo "install.sh: $*" >&2
    exit 1
}

while [ $# -gt 0 ]; do
    case "$1" in
        --version) [ $# -ge 2 ] || fail "--version needs a version"; version="$2"; shift 2 ;;
        --from) [ $# -ge 2 ] || fail "--from needs a wheel or a folder"; source="$2"; shift 2 ;;
        --extra) [ $# -ge 2 ] || fail "--extra needs a name"; extra="$2"; shift 2 ;;
        --uninstall) action="uninstall"; shift ;;
        -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) fail "unknown option $1 (see --help)" ;;
    esac
done

if [ "$action" = "uninstall" ]; then
    if [ -L "$bin_dir/gpulayer" ] && [ "$(readlink "$bin_dir/gpulayer")" = "$install_dir/venv/bin/gpulayer" ]; then
        rm "$bin_dir/gpulayer"
    fi
    rm -rf "$install_dir"
    echo "removed $install_dir and its link in $bin_dir (your jobs' home, ~/.gpulayer, is kept)"
    exit 0
fi

[ -z "$version" ] || [ -z "$source" ] || fail "give --version or --from, not both"
command -v "$python" >/dev/null 2>&1 || fail "$python not found: install Python 3.10 or newer, or set PYTHON"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
    fail "$("$python" -V 2>&1) is too old: GPUlayer needs Python 3.10 or newer (set PYTHON to another)"
"$python" -c 'import venv, ensurepip' 2>/dev/null ||
    fail "$python has no venv module: install it (Debian and Ubuntu: the python3-venv package)"

if [ -n "$source" ]; then
    [ -e "$source" ] || fail "$source does not exist"
    case "$source" in
        /*) ;;
        *) source="$(pwd)/$source" ;;
    esac
    requirement="$source"
    if [ -n "$extra" ]; then
        [ -d "$source" ] || fail "--extra with --from takes a folder, not a wheel"
        requirement="${source}[${extra}]"
    fi
else
    requirement="gpulayer${extra:+[$extra]}${version:+==$version}"
fi

mkdir -p "$install_dir" "$bin_dir"
if [ ! -x "$install_dir/venv/bin/python" ]; then
    "$python" -m venv "$install_dir/venv"
    made="made"
else
    made="kept"
fi
# --upgrade: a second run brings the newest release (or what --from names now).
"$install_dir/venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade "$requirement" ||
    fail "pip could not install $requirement (the environment in $install_dir is left as it was)"
ln -sf "$install_dir/venv/bin/gpulayer" "$bin_dir/gpulayer"

installed="$("$bin_dir/gpulayer" --version)"
echo "installed $installed into $install_dir/venv ($made), linked as $bin_dir/gpulayer"
case ":$PATH:" in
    *":$bin_dir:"*) ;;
    *) echo "note: $bin_dir is not on your PATH; add it, e.g. export PATH=\"$bin_dir:\$PATH\"" ;;
esac
echo "next: gpulayer up   (an embedded Redis and a local worker), then gpulayer submit --wait -- echo hello"
