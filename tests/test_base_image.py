"""compose/base-image.sh, the Compose stack's base image from Debian's packages, without a Docker
engine or a Debian mirror: debootstrap and docker are stand-ins on PATH that write what a real one
would (a minimal root with the user redis) and keep what the script hands them (the image's tar).
tests/test_compose.py makes the real image with the same script, where an engine answers."""

from __future__ import annotations

import os
import stat
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "compose" / "base-image.sh"

FAKE_DEBOOTSTRAP = """#!/bin/sh
echo "$@" > "$RECORD/debootstrap.args"
rootfs="$4"  # --variant=... --include=... SUITE TARGET MIRROR
mkdir -p "$rootfs/etc" "$rootfs/usr/bin" "$rootfs/var/lib/apt/lists"
echo "root:x:0:0:root:/root:/bin/sh" > "$rootfs/etc/passwd"
echo "redis:x:$(id -u):$(id -g)::/var/lib/redis:/usr/sbin/nologin" >> "$rootfs/etc/passwd"
touch "$rootfs/usr/bin/python3" "$rootfs/var/lib/apt/lists/bookworm_InRelease"
"""

FAKE_DOCKER = """#!/bin/sh
echo "$@" >> "$RECORD/docker.args"
case "$1 $2" in
  "image inspect") [ -e "$RECORD/image.tar" ] ;;
  "import -") cat > "$RECORD/image.tar" ;;
  *) exit 2 ;;
esac
"""


def stand_ins(folder: Path) -> Path:
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    for name, text in (("debootstrap", FAKE_DEBOOTSTRAP), ("docker", FAKE_DOCKER)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    return bin_dir


def make(record: Path, bin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "RECORD": str(record),
        "GPULAYER_BASE_MIRROR": "http://mirror.invalid/debian",
    }
    return subprocess.run(
        [str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_base_image_is_debians_minimal_system_with_python_and_redis_and_a_data_folder_for_redis(
    tmp_path: Path,
) -> None:
    bin_dir = stand_ins(tmp_path)
    made = make(tmp_path, bin_dir, "local/base:test")
    assert made.returncode == 0, made.stderr

    debootstrap = (tmp_path / "debootstrap.args").read_text().split()
    assert debootstrap[0] == "--variant=minbase"
    assert set(debootstrap[1].removeprefix("--include=").split(",")) == {
        "python3",
        "python3-venv",
        "ca-certificates",
        "redis-server",
    }
    assert debootstrap[2] == "bookworm"
    assert debootstrap[-1] == "http://mirror.invalid/debian"
    assert "import - local/base:test" in (tmp_path / "docker.args").read_text()
    with tarfile.open(tmp_path / "image.tar") as image:
        data = image.getmember("./data")
        names = image.getnames()
    assert data.isdir()
    assert (data.uid, data.gid) == (os.getuid(), os.getgid())  # the user redis's, as the stand-in made it
    assert "./usr/bin/python3" in names
    assert not [name for name in names if name.startswith("./var/lib/apt/lists")]  # no package lists
    assert not Path(debootstrap[-2]).exists()  # the root it was made in is gone


def test_an_image_already_there_is_kept_and_nothing_is_made(tmp_path: Path) -> None:
    bin_dir = stand_ins(tmp_path)
    (tmp_path / "image.tar").write_bytes(b"made before")
    kept = make(tmp_path, bin_dir)
    assert kept.returncode == 0, kept.stderr
    assert "local/gpulayer-base:bookworm is already there" in kept.stderr
    assert not (tmp_path / "debootstrap.args").exists()
    assert (tmp_path / "image.tar").read_bytes() == b"made before"
