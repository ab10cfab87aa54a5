"""Folders to archives and back: what ships, what is refused, and what an archive may not do."""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from gpulayer import ArchiveError, InputNotFound, Settings, SourceError
from gpulayer.archive import (
    Manifest,
    inputs_manifest,
    outputs_manifest,
    source_manifest,
    summarize,
)
from gpulayer.bundles import BundleCache, archive_digest
from gpulayer.unpacking import extract

BIG = 1 << 30
#: GPUlayer's home where these tests' folders are not.
HOME = Settings().home


def make(root: Path, files: dict[str, str]) -> Path:
    """Files under ``root`` by relative path; a path ending in ``/`` is an empty folder."""
    for name, text in files.items():
        path = root / name
        if name.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return root


def round_trip(manifest: Manifest, dest: Path) -> list[Path]:
    buffer = io.BytesIO()
    manifest.write(buffer)
    buffer.seek(0)
    dest.mkdir()
    return extract(buffer, dest, max_bytes=BIG)


# The source folder


def test_the_source_skips_git_pycache_and_venv(tmp_path: Path) -> None:
    src = make(
        tmp_path, {"main.py": "", ".git/HEAD": "", "pkg/__pycache__/m.pyc": "", ".venv/bin/python": ""}
    )
    assert set(source_manifest(src, BIG, HOME).members) == {"main.py", "pkg"}


def test_a_root_gitignore_applies_to_the_whole_folder(tmp_path: Path) -> None:
    ignored = ["a.log", "sub/b.log", "build/out.o", "sub/build/x", "secret.txt"]
    files = dict.fromkeys([*ignored, "sub/secret.txt", "keep.py"], "")
    src = make(tmp_path, {".gitignore": "*.log\nbuild/\n/secret.txt\n", **files})
    assert set(source_manifest(src, BIG, HOME).members) == {".gitignore", "keep.py", "sub", "sub/secret.txt"}


def test_a_nested_gitignore_applies_only_to_its_folder(tmp_path: Path) -> None:
    ignored = ["sub/a.bin", "sub/deep/b.bin"]
    kept = ["top.bin", "sub/keep.txt", "other/c.bin", "subway/d.bin"]
    src = make(tmp_path, {"sub/.gitignore": "*.bin\n", **dict.fromkeys([*ignored, *kept], "")})
    assert set(source_manifest(src, BIG, HOME).members) == {
        *("sub", "sub/.gitignore", "sub/deep", "other", "subway"),
        *kept,
    }


def test_empty_folders_are_kept(tmp_path: Path) -> None:
    src = make(tmp_path, {"empty/": "", "nested/also_empty/": ""})
    assert set(source_manifest(src, BIG, HOME).members) == {"empty", "nested", "nested/also_empty"}


def test_the_size_counts_only_what_ships(tmp_path: Path) -> None:
    src = make(
        tmp_path, {".gitignore": "*.ckpt\n", "big.ckpt": "x" * 5000, "a.py": "x" * 10, "b/c.py": "x" * 7}
    )
    shipped = len("*.ckpt\n") + 10 + 7
    assert source_manifest(src, shipped, HOME).size == shipped


def test_the_home_and_every_installations_keys_stay_behind_wherever_they_are(tmp_path: Path) -> None:
    files = {
        "train.py": "",
        "deploy/.gpulayer/installation.json": "{}",
        "deploy/.gpulayer/access/admin.json": "{}",
        "deploy/.gpulayer/tls/ca.key": "",
        "deploy/.gpulayer/notes.txt": "",
        "copy/installation.json": "{}",
        "copy/access/worker.json": "{}",
        "copy/access/README": "",
    }
    src = make(tmp_path / "src", files)
    shipped = {"train.py", "deploy", "copy", "copy/access", "copy/access/README"}
    assert set(source_manifest(src, BIG, src / "deploy" / ".gpulayer").members) == shipped
    # A function's code bundle is packed the same way.
    bundle = BundleCache(BIG, src / "deploy" / ".gpulayer").get(src)
    assert set(bundle.manifest.members) == shipped
    # The home elsewhere: only the keys stay behind.
    assert "deploy/.gpulayer/notes.txt" in source_manifest(src, BIG, HOME).members
    for inside_the_home in (src / "deploy" / ".gpulayer", src / "deploy" / ".gpulayer" / "access"):
        with pytest.raises(SourceError, match="is in GPUlayer's home"):
            source_manifest(inside_the_home, BIG, src / "deploy" / ".gpulayer")


def test_a_missing_source_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SourceError) as raised:
        source_manifest(tmp_path / "nope", BIG, HOME)
    assert str(raised.value) == f"source folder not found: {tmp_path / 'nope'}"


def test_a_source_above_the_cap_is_refused(tmp_path: Path) -> None:
    src = make(tmp_path, {"a.bin": "x" * 1000})
    assert source_manifest(src, 1000, HOME).size == 1000
    with pytest.raises(SourceError, match="above the 999 B cap"):
        source_manifest(src, 999, HOME)


def test_links_inside_the_folder_are_kept_as_links(tmp_path: Path) -> None:
    src = make(tmp_path / "src", {"f.txt": "hello", "pkg/m.py": "x" * 100})
    (src / "link").symlink_to("f.txt")
    (src / "pkg" / "up").symlink_to("../f.txt")
    (src / "alias").symlink_to("pkg", target_is_directory=True)
    manifest = source_manifest(src, BIG, HOME)
    assert set(manifest.members) == {"f.txt", "link", "pkg", "pkg/m.py", "pkg/up", "alias"}
    assert manifest.size == 105
    dest = tmp_path / "dest"
    round_trip(manifest, dest)
    assert os.readlink(dest / "link") == "f.txt"
    assert (dest / "pkg" / "up").read_text() == "hello"
    assert (dest / "alias").is_symlink()
    assert (dest / "alias" / "m.py").read_text() == "x" * 100


def test_links_pointing_outside_the_folder_are_listed_as_skipped(tmp_path: Path) -> None:
    outside = make(tmp_path / "outside", {"secret": "s"})
    src = make(tmp_path / "src", {"f.txt": ""})
    (src / "to_file").symlink_to(outside / "secret")
    (src / "to_dir").symlink_to("../outside", target_is_directory=True)
    manifest = source_manifest(src, BIG, HOME)
    assert set(manifest.members) == {"f.txt"}
    assert sorted(manifest.skipped_links) == ["to_dir", "to_file"]


def test_an_absolute_link_to_a_file_inside_the_folder_survives_a_round_trip(tmp_path: Path) -> None:
    src = make(tmp_path / "src", {"f.txt": "hello"})
    (src / "link").symlink_to(src / "f.txt")
    round_trip(source_manifest(src, BIG, HOME), tmp_path / "dest")
    assert (tmp_path / "dest" / "link").read_text() == "hello"


# Inputs


def test_inputs_land_under_their_base_name(tmp_path: Path) -> None:
    make(tmp_path, {"a/data.csv": "1,2\n", "b/ds/f1": "xy", "b/ds/sub/f2": "z", "b/ds/empty/": ""})
    manifest = inputs_manifest([tmp_path / "a" / "data.csv", tmp_path / "b" / "ds"])
    assert set(manifest.members) == {"data.csv", "ds", "ds/f1", "ds/sub", "ds/sub/f2", "ds/empty"}
    assert manifest.size == 7


def test_a_missing_input_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputNotFound) as raised:
        inputs_manifest([tmp_path / "nope.csv"])
    assert str(raised.value) == f"input not found: {tmp_path / 'nope.csv'}"


@pytest.mark.parametrize("second", ["b/data", "c/data/"])
def test_two_inputs_with_the_same_base_name_are_refused(tmp_path: Path, second: str) -> None:
    make(tmp_path, {"a/data": "", second: ""})
    with pytest.raises(InputNotFound) as raised:
        inputs_manifest([tmp_path / "a" / "data", tmp_path / second])
    assert str(raised.value) == "two inputs are named 'data'; each input keeps its base name"


# Outputs


def test_output_patterns_match_globs_including_double_star(tmp_path: Path) -> None:
    make(tmp_path, dict.fromkeys(["model.pt", "logs/a.json", "logs/x/b.json", "logs/x/c.txt", "o.txt"], ""))
    manifest, missing = outputs_manifest(tmp_path, ["*.pt", "logs/**/*.json"])
    assert set(manifest.members) == {"model.pt", "logs/a.json", "logs/x/b.json"}
    assert missing == []


def test_patterns_that_match_nothing_are_reported_missing(tmp_path: Path) -> None:
    make(tmp_path, {"model.pt": ""})
    _, missing = outputs_manifest(tmp_path, ["model.pt", "*.onnx", "results/"])
    assert missing == ["*.onnx", "results/"]


def test_a_file_matched_by_two_patterns_is_counted_once(tmp_path: Path) -> None:
    make(tmp_path, {"model.pt": "x" * 10, "out/a.bin": "y" * 5})
    dest = io.BytesIO()
    patterns = ["*.pt", "model.pt", "**/*.pt", "out/a.bin", "out"]
    manifest, missing = outputs_manifest(tmp_path, patterns)
    summary = summarize(manifest, missing)
    manifest.write(dest)
    assert (summary.files, summary.bytes, summary.missing) == (2, 15, [])
    dest.seek(0)
    with tarfile.open(fileobj=dest) as tar:
        assert sorted(tar.getnames()) == ["model.pt", "out", "out/a.bin"]


# Unpacking


def test_an_archive_written_by_a_manifest_round_trips(tmp_path: Path) -> None:
    src = make(tmp_path / "src", {"run.sh": "#!/bin/sh\necho hi\n", "data/x.txt": "ünï", "empty/": ""})
    (src / "run.sh").chmod(0o755)
    (src / "data" / "x.txt").chmod(0o644)
    dest = tmp_path / "dest"
    written = round_trip(source_manifest(src, BIG, HOME), dest)
    assert sorted(written) == [dest / "data" / "x.txt", dest / "run.sh"]
    assert (dest / "run.sh").read_text() == "#!/bin/sh\necho hi\n"
    assert (dest / "data" / "x.txt").read_text() == "ünï"
    assert (dest / "empty").is_dir()
    assert (dest / "run.sh").stat().st_mode & stat.S_IXUSR
    assert not (dest / "data" / "x.txt").stat().st_mode & stat.S_IXUSR


def entry(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "", data: bytes = b"") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, linkname, len(data)
    return info


def tar_of(*entries: tarfile.TarInfo) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info in entries:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    buffer.seek(0)
    return buffer


@pytest.fixture
def box(tmp_path: Path) -> Path:
    """A folder holding only the destination: anything else that appears in it was written outside."""
    (tmp_path / "box" / "dest").mkdir(parents=True)
    return tmp_path / "box"


UNSAFE = "unsafe archive entry: "
OUTSIDE = "would land outside its folder"
NOT_REGULAR = "is not a file, folder or link"
UNSAFE_ARCHIVES = {
    "dotdot": ([entry("../evil", data=b"x")], OUTSIDE),
    "nested_dotdot": ([entry("a/../../evil", data=b"x")], OUTSIDE),
    "link_out_absolute": ([entry("esc", tarfile.SYMTYPE, "/"), entry("esc/evil", data=b"x")], UNSAFE),
    "link_out_relative": ([entry("esc", tarfile.SYMTYPE, ".."), entry("esc/evil", data=b"x")], UNSAFE),
    "char_device": ([entry("null", tarfile.CHRTYPE)], NOT_REGULAR),
    "block_device": ([entry("sda", tarfile.BLKTYPE)], NOT_REGULAR),
    "fifo": ([entry("pipe", tarfile.FIFOTYPE)], NOT_REGULAR),
    "hard_link": ([entry("f", data=b"x"), entry("h", tarfile.LNKTYPE, "f")], "is a hard link"),
}


@pytest.mark.parametrize("case", UNSAFE_ARCHIVES)
def test_an_unsafe_archive_is_refused_and_nothing_lands_outside(box: Path, case: str) -> None:
    entries, message = UNSAFE_ARCHIVES[case]
    with pytest.raises(ArchiveError, match=message):
        extract(tar_of(*entries), box / "dest", max_bytes=BIG)
    assert list(box.iterdir()) == [box / "dest"]


def test_an_absolute_path_lands_nowhere_outside_the_destination(box: Path) -> None:
    with contextlib.suppress(ArchiveError):
        extract(tar_of(entry(str(box / "evil"), data=b"x")), box / "dest", max_bytes=BIG)
    assert list(box.iterdir()) == [box / "dest"]


def test_an_absolute_path_is_refused(box: Path) -> None:
    with pytest.raises(ArchiveError):
        extract(tar_of(entry(str(box / "evil"), data=b"x")), box / "dest", max_bytes=BIG)


def test_the_paths_extract_returns_are_those_it_wrote(tmp_path: Path) -> None:
    src = make(tmp_path / "src", {"a.txt": "1", "b/c.txt": "2"})
    written = round_trip(source_manifest(src, BIG, HOME), tmp_path / "dest")
    assert sorted(p.relative_to(tmp_path / "dest").as_posix() for p in written) == ["a.txt", "b/c.txt"]


def test_something_that_is_not_an_archive_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match="not a tar archive"):
        extract(io.BytesIO(b"not a tar file at all" * 50), tmp_path, max_bytes=BIG)


# Headers: capped before tarfile reads what they say follows


def header(kind: bytes, size: int, name: str = "././@LongLink") -> bytes:
    """One 512-byte tar header of ``kind`` saying ``size`` bytes follow it (none do)."""
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    return info.tobuf(format=tarfile.GNU_FORMAT)


def pax(kind: bytes, records: dict[str, str]) -> bytes:
    """A pax header of ``kind`` holding ``records``, its data padded to a block."""
    data = b"".join(pax_record(key, value) for key, value in records.items())
    return header(kind, len(data), "././@PaxHeader") + data + b"\0" * (-len(data) % tarfile.BLOCKSIZE)


def pax_record(key: str, value: str) -> bytes:
    body = f" {key}={value}\n".encode()
    length = len(body) + len(str(len(body)))
    length += len(str(length)) - len(str(len(body)))  # the length counts its own digits
    return str(length).encode() + body


def archive_of(*blocks: bytes) -> io.BytesIO:
    """A gzip archive of these blocks, then a file ``f`` and the archive's end."""
    end = tar_of(entry("f", data=b"x")).getvalue()
    return io.BytesIO(gzip.compress(b"".join(blocks) + end))


#: One header of each kind whose metadata tarfile would read whole, each saying it holds 1 GiB.
HEADERS = {
    "gnu_long_name": tarfile.GNUTYPE_LONGNAME,
    "gnu_long_link": tarfile.GNUTYPE_LONGLINK,
    "pax_extended": tarfile.XHDTYPE,
    "pax_global": tarfile.XGLTYPE,
}


@pytest.mark.parametrize("kind", HEADERS)
def test_a_header_carrying_more_than_64_kib_of_metadata_is_refused_before_it_is_read(
    box: Path, kind: str
) -> None:
    with pytest.raises(ArchiveError, match=r"an archive header carries 1\.0 GiB of metadata, above the"):
        extract(archive_of(header(HEADERS[kind], 1 << 30)), box / "dest", max_bytes=BIG)
    assert list(box.iterdir()) == [box / "dest"]
    assert list((box / "dest").iterdir()) == []


def test_a_code_bundle_with_such_a_header_is_refused_before_it_is_read() -> None:
    with pytest.raises(ArchiveError, match="an archive header carries"):
        archive_digest(archive_of(header(tarfile.GNUTYPE_LONGNAME, 1 << 30)), BIG)


def test_global_pax_headers_are_capped_together(box: Path) -> None:
    each = pax(tarfile.XGLTYPE, {"comment": "x" * 30_000})
    extract(archive_of(each, each), box / "dest", max_bytes=BIG)  # one key, set twice: 30 kB kept
    many = [pax(tarfile.XGLTYPE, {f"comment{n}": "x" * 30_000}) for n in range(3)]
    with pytest.raises(ArchiveError, match="the archive's global pax headers carry more than"):
        extract(archive_of(*many), box / "dest2", max_bytes=BIG)


def test_a_chain_of_headers_with_no_entry_is_refused(box: Path) -> None:
    with pytest.raises(ArchiveError, match="an archive header is followed by too many others"):
        extract(archive_of(pax(tarfile.XHDTYPE, {"comment": "x"}) * 5000), box / "dest", max_bytes=BIG)


def test_sparse_files_whose_map_has_no_bound_are_refused(box: Path) -> None:
    with pytest.raises(ArchiveError, match="'sparse' is a sparse file, which is not taken"):
        extract(archive_of(header(tarfile.GNUTYPE_SPARSE, 0, "sparse")), box / "dest", max_bytes=BIG)
    # pax's sparse 1.0: the map of holes heads the file's data, as long as it says it is.
    records = pax(tarfile.XHDTYPE, {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "s"})
    body = b"1000000000\n" + b"0\n" * 255 + b"0"
    blocks = records + header(tarfile.REGTYPE, len(body), "GNUSparseFile.0/s") + body
    with pytest.raises(ArchiveError, match="is a sparse file, which is not taken"):
        extract(archive_of(blocks), box / "dest", max_bytes=BIG)


def test_long_names_and_pax_records_under_the_cap_unpack(tmp_path: Path) -> None:
    name = "/".join(["d" * 200] * 4) + "/f.txt"  # 808 bytes: a GNU long name, or a pax path
    for format in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz", format=format) as tar:
            info = tarfile.TarInfo(name)
            info.size, info.pax_headers = 2, {"comment": "c" * 10_000}
            tar.addfile(info, io.BytesIO(b"ok"))
        buffer.seek(0)
        written = extract(buffer, tmp_path / str(format), max_bytes=BIG)
        assert [path.read_bytes() for path in written] == [b"ok"]
