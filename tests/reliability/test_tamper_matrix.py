"""The tamper matrix: every stored object kind x every attack, against every consumer that reads it.

An attacker controls the store (every key and byte in it) but not the signing key. For each kind of
stored object and each attack, the consumers that read that object (full pull, rank pull, ``verify
REF``, ``fsck``, ``evidence REF``, and ``registry up``'s driver resolve plus a rank's load) must
refuse: exit 1 with a typed verification error or finding, never exit 0 and never exit 70. The table
below says what each cell does and which consumers read the object; a cell that could not be made is
listed in :data:`NOT_APPLICABLE` with the reason (none today: all 40 cells run). On a local store; the
blob and tile attacks run again on S3 (moto) for the readers of ranges (rank pull, up), with the one
cell they cannot see in :data:`S3_NOT_DETECTED`.

Attacks: *flip* one bit; *truncate* (half the object, or one byte off a tile); *extend* (junk
appended, or one byte inserted into a tile); *swap* in another valid object of the same kind (from
another repository, or another tile of the same tensor); *replay* an older valid copy (the same
object of version 1 of the tag, or the tag rolled back to version 1 for a client that saw version 2).

Content-addressed objects (file blob, tile index, manifest, producer witness, and the signature and
evidence blobs) are named by a signed digest: replacing their bytes under their key is caught by
the digest. Signatures and evidence are found through unsigned referrer links, so their swap and
replay re-point the link instead (the stronger attack: the substituted blob is intact and validly
signed, only about another manifest). Tag documents live under mutable keys; they are caught by
their signature, their chain and the client's memory of the version it saw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tamper_world import NAME, OTHER, REF, TAG, WEIGHT, Digests, World, build, cli, copy_world, home_at

from shardport.registry import errors as registry_errors
from shardport.registry.evidence import EVIDENCE_ARTIFACT
from shardport.registry.store.keys import blob_key, referrer_key, tag_key
from shardport.registry.tiles.model import tile_pieces
from shardport.registry.trust.signatures import SIGNATURE_ARTIFACT

KINDS = (
    "file blob",
    "tile",
    "tile index",
    "manifest",
    "signature",
    "tag document",
    "evidence",
    "producer witness",
)
ATTACKS = ("flip", "truncate", "extend", "swap", "replay")
CONSUMERS = ("pull", "rank pull", "verify", "fsck", "evidence", "up")

NOT_APPLICABLE: dict[tuple[str, str], str] = {}
"""Cells that cannot be made, with the reason (empty: every cell of KINDS x ATTACKS runs)."""


# ---- attacks on bytes --------------------------------------------------------------------------------


def flip(data: bytes) -> bytes:
    i = len(data) // 2
    return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]


def truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def extend(data: bytes) -> bytes:
    return data + b'\x00{"x":1}'


BYTE_ATTACKS: dict[str, Callable[[bytes], bytes]] = {"flip": flip, "truncate": truncate, "extend": extend}


def rewrite(w: World, key: str, change: Callable[[bytes], bytes]) -> None:
    w.session.store.put(key, change(w.session.store.read(key)))


def replace_blob(w: World, digest: str, other: str) -> None:
    """Put the bytes of blob ``other`` (a valid object of the same kind) under ``digest``'s key."""
    assert other != digest
    w.session.store.put(blob_key(digest), w.session.store.read_blob(other))


def relink(w: World, artifact: str, own: str, other: str) -> None:
    """Detach ``own`` from version 2's manifest and attach ``other`` (another valid blob) in its place."""
    from shardport.registry.trust.signatures import attach

    assert other != own
    w.session.store.delete(referrer_key(NAME, w.d.v2, own))
    attach(w.session, NAME, w.d.v2, other, artifact)


# ---- tiles: byte ranges of the file blob named by the tile index ---------------------------------------


def tile_range(w: World, digest: str | None = None, k: int = 0) -> tuple[int, int]:
    """(offset, length) of the first piece of tile ``k`` of the quantized weight's code plane."""
    tiles = w.tile_index(digest).tensors[WEIGHT.removesuffix("weight") + "qweight"]
    assert tiles.grid_rows * tiles.grid_cols >= 2, "the world must cut the plane into several tiles"
    i, j = divmod(k, tiles.grid_cols)
    return tile_pieces(tiles, i, j)[0]


def tile_attack(attack: str) -> Callable[[World], None]:
    def run(w: World) -> None:
        key = blob_key(w.file_digest())
        data = bytearray(w.session.store.read(key))
        at, n = tile_range(w)
        if attack == "flip":
            data[at + n // 2] ^= 0x01
        elif attack == "truncate":  # the tile loses its last byte; everything after it moves up
            del data[at + n - 1]
        elif attack == "extend":  # the tile gains a byte; everything after it moves down
            data[at + n : at + n] = b"\x00"
        elif attack == "swap":  # tile 0 and tile 1 of the same plane change places
            at1, n1 = tile_range(w, k=1)
            assert n1 == n and data[at : at + n] != data[at1 : at1 + n]
            data[at : at + n], data[at1 : at1 + n] = data[at1 : at1 + n], data[at : at + n]
        else:  # replay: version 1's bytes of the same tile
            old = w.session.store.read_blob(w.file_digest(w.d.v1))
            at0, n0 = tile_range(w, w.d.v1)
            assert (at0, n0) == (at, n) and old[at : at + n] != data[at : at + n]
            data[at : at + n] = old[at : at + n]
        w.session.store.put(key, bytes(data))

    return run


# ---- the table -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    what: str  # what the attacker does, in words (the table's text)
    tamper: Callable[[World], None]
    consumers: tuple[str, ...]  # the consumers that read this object, each must refuse


def _blob_cells(
    kind: str,
    digest: Callable[[World, str | None], str],
    other: Callable[[World], str],
    consumers: tuple[str, ...],
) -> dict[tuple[str, str], Cell]:
    cells = {
        (kind, a): Cell(
            f"{a} the {kind} blob's bytes", lambda w, f=f: rewrite(w, blob_key(digest(w, None)), f), consumers
        )
        for a, f in BYTE_ATTACKS.items()
    }
    cells[(kind, "swap")] = Cell(
        f"another repository's {kind} under this {kind}'s key",
        lambda w: replace_blob(w, digest(w, None), other(w)),
        consumers,
    )
    cells[(kind, "replay")] = Cell(
        f"version 1's {kind} under version 2's {kind} key",
        lambda w: replace_blob(w, digest(w, None), digest(w, w.d.v1)),
        consumers,
    )
    return cells


def _linked_cells(
    kind: str, artifact: str, blob: Callable[[World, str, str | None], str], consumers: tuple[str, ...]
) -> dict[tuple[str, str], Cell]:
    cells = {
        (kind, a): Cell(
            f"{a} the {kind} blob's bytes",
            lambda w, f=f: rewrite(w, blob_key(blob(w, NAME, None)), f),
            consumers,
        )
        for a, f in BYTE_ATTACKS.items()
    }
    cells[(kind, "swap")] = Cell(
        f"the link re-pointed at another repository's (valid) {kind}",
        lambda w: relink(w, artifact, blob(w, NAME, None), blob(w, OTHER, w.d.other)),
        consumers,
    )
    cells[(kind, "replay")] = Cell(
        f"the link re-pointed at version 1's (valid) {kind}",
        lambda w: relink(w, artifact, blob(w, NAME, None), blob(w, NAME, w.d.v1)),
        consumers,
    )
    return cells


def _tag_cells() -> dict[tuple[str, str], Cell]:
    key = tag_key(NAME, TAG, 2)
    consumers = ("pull", "rank pull", "verify", "fsck", "up")
    cells = {
        ("tag document", a): Cell(f"{a} version 2's document", lambda w, f=f: rewrite(w, key, f), consumers)
        for a, f in BYTE_ATTACKS.items()
    }
    cells[("tag document", "swap")] = Cell(
        "version 1's (valid, signed) document stored as version 2",
        lambda w: w.session.store.put(key, w.session.store.read(tag_key(NAME, TAG, 1))),
        consumers,
    )
    cells[("tag document", "replay")] = Cell(
        "the tag rolled back to version 1 (version 2 withheld) for a client that saw version 2",
        lambda w: w.session.store.delete(key),
        ("pull", "rank pull", "verify", "up"),  # fsck has no client memory: version 1 alone is a valid store
    )
    return cells


ALL_READERS = ("pull", "rank pull", "verify", "fsck", "up")
MATRIX: dict[tuple[str, str], Cell] = {
    **_blob_cells(
        "file blob", lambda w, d: w.file_digest(d), lambda w: w.file_digest(w.d.other), ALL_READERS
    ),
    **{("tile", a): Cell(f"{a} tile 0 of the code plane", tile_attack(a), ALL_READERS) for a in ATTACKS},
    **_blob_cells(  # a full pull hashes whole files and does not read the tile index
        "tile index",
        lambda w, d: w.tile_index_digest(d),
        lambda w: w.tile_index_digest(w.d.other),
        ("rank pull", "verify", "fsck", "up"),
    ),
    **_blob_cells("manifest", lambda w, d: d or w.d.v2, lambda w: w.d.other, (*ALL_READERS, "evidence")),
    # up reads neither evidence (it writes it) nor the producer witness file
    **_linked_cells("signature", SIGNATURE_ARTIFACT, lambda w, n, d: w.signature(n, d), ALL_READERS),
    **_tag_cells(),
    **_linked_cells("evidence", EVIDENCE_ARTIFACT, lambda w, n, d: w.evidence(n, d), ("verify", "evidence")),
    **_blob_cells(
        "producer witness",
        lambda w, d: w.witness_digest(d),
        lambda w: w.witness_digest(w.d.other),
        ("pull", "verify", "fsck"),  # a rank pull re-decodes the manifest's decode witnesses, not this file
    ),
}


# ---- consumers -----------------------------------------------------------------------------------------


def consume(w: World, consumer: str) -> tuple[int, dict[str, Any]]:
    if consumer == "pull":
        return cli(w.store, "pull", REF, w.root / "pulled")
    if consumer == "rank pull":
        return cli(w.store, "pull", REF, w.root / "rank0", "--tp", "2", "--rank", "0")
    if consumer == "verify":
        return cli(w.store, "verify", REF)
    if consumer == "fsck":
        return cli(w.store, "fsck")
    if consumer == "up":
        return up(w)
    assert consumer == "evidence"
    return cli(w.store, "evidence", REF)


def up(w: World) -> tuple[int, dict[str, Any]]:
    """What ``registry up`` reads before a model runs: the driver resolves the tag (tag history, manifest,
    signatures), each rank resolves the pinned digest again and loads its tensors (``load_rank``, tp 2).
    In-process, without Ray: the same functions the driver and a rank actor call."""
    from shardport import ShardportError
    from shardport.loader import load_rank
    from shardport.placement.topology import Topology
    from shardport.registry.artifact.refs import parse_ref
    from shardport.registry.session import Session
    from shardport.registry.trust.resolve import resolve

    try:
        session = Session.open(w.store)
        driver = resolve(session, parse_ref(REF))
        pinned = resolve(session, parse_ref(f"{NAME}@{driver.digest}"))
        load_rank(session, pinned, Topology(tp=2), 0)
    except ShardportError as exc:
        return exc.exit_code, {"error": {"type": type(exc).__name__, "message": str(exc)}}
    return 0, {"ok": True}


def refusal(out: dict[str, Any]) -> str:
    """The error type or finding kinds a consumer's JSON names."""
    if "error" in out:
        return str(out["error"]["type"])
    found = [f.get("kind") or f.get("type") for f in out.get("findings", []) + out.get("failures", [])]
    return ",".join(sorted(map(str, found))) or "(findings elsewhere)"


def typed(name: str) -> bool:
    """Whether ``name`` is one of our errors that means "verification failed" (exit 1): a
    ``VerificationError``, or a loader error of exit 1; not a crash, not an internal error."""
    from shardport import ShardportError
    from shardport.loader import errors as loader_errors
    from shardport.provenance import errors as provenance_errors
    from shardport.registry.contracts import errors as contract_errors
    from shardport.registry.tiles import errors as tile_errors

    for module in (registry_errors, contract_errors, tile_errors, provenance_errors, loader_errors):
        cls = getattr(module, name, None)
        if isinstance(cls, type) and issubclass(cls, registry_errors.VerificationError):
            return True
        if isinstance(cls, type) and issubclass(cls, ShardportError) and module is loader_errors:
            return cls.exit_code == 1
    return False


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Digests]:
    root = tmp_path_factory.mktemp("tamper-world")
    with home_at(root / "home"):
        return root, build(root)


@pytest.fixture
def world(built: tuple[Path, Digests], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    monkeypatch.setenv("SHARDPORT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SHARDPORT_STORE", raising=False)
    return copy_world(built[0], tmp_path, built[1])


def test_the_untampered_world_is_accepted_by_every_consumer(world: World) -> None:
    """The control: each consumer accepts the world as built, so each refusal below is the attack's."""
    for consumer in CONSUMERS:
        code, out = consume(world, consumer)
        assert code == 0, (consumer, out)
    assert world.tile_index().tensors  # several tiles per plane (tile_range asserts it)
    assert tile_range(world, k=1)[0] > tile_range(world)[0]


def test_the_matrix_covers_every_kind_and_attack() -> None:
    cells = {(k, a) for k in KINDS for a in ATTACKS}
    assert set(MATRIX) | set(NOT_APPLICABLE) == cells
    assert not set(MATRIX) & set(NOT_APPLICABLE)
    assert all(NOT_APPLICABLE.values())  # every excluded cell says why


@pytest.mark.parametrize(
    ("kind", "attack"), list(MATRIX), ids=[f"{k}-{a}".replace(" ", "_") for k, a in MATRIX]
)
def test_tampering_is_detected(kind: str, attack: str, world: World) -> None:
    cell = MATRIX[(kind, attack)]
    cell.tamper(world)
    outcomes = {c: consume(world, c) for c in cell.consumers}
    for consumer, (code, out) in outcomes.items():
        assert code == 1, (cell.what, consumer, out)  # never 0 (accepted), never 70 (a crash)
        assert out.get("ok", False) is False, (cell.what, consumer, out)
        if "error" in out:
            assert typed(out["error"]["type"]), (cell.what, consumer, out)
    assert not (world.root / "pulled").exists()
    assert not (world.root / "rank0").exists() or "rank pull" not in cell.consumers


# ---- the same attacks on an S3 store, where ranks read ranges over HTTP ---------------------------------

S3_CELLS = [("file blob", a) for a in ("flip", "truncate", "swap", "replay")] + [("tile", a) for a in ATTACKS]
S3_NOT_DETECTED: dict[tuple[str, str], str] = {
    ("file blob", "extend"): (
        "a rank pull (and an up rank) on S3 reads only its own ranges, with no HEAD request, and verifies "
        "every byte it loads: bytes appended after the file's end are loaded by no rank, so nothing it "
        "loads differs; pull, verify and fsck refuse the blob (as on a local store, above)"
    ),
}


@pytest.fixture(scope="module")
def s3_world(moto_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("tamper-s3")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in moto_server.env().items():
            mp.setenv(k, v)
        store = f"s3://{moto_server.new_bucket()}/registry"
        with home_at(root / "home"):
            digests = build(root, store)
        yield root, digests, store


@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "attack"), S3_CELLS, ids=[f"{k}-{a}".replace(" ", "_") for k, a in S3_CELLS]
)
def test_tampering_is_detected_by_ranks_reading_s3(
    kind: str, attack: str, s3_world: tuple[Path, Digests, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, digests, store = s3_world
    monkeypatch.setenv("SHARDPORT_HOME", str(root / "home"))
    w = World(root, digests, store)
    key = blob_key(w.file_digest())
    original = w.session.store.read(key)
    MATRIX[(kind, attack)].tamper(w)
    try:
        for consumer in ("rank pull", "up"):
            code, out = consume(w, consumer)
            assert code == 1 and typed(out["error"]["type"]), (kind, attack, consumer, out)
            assert not (root / "rank0").exists()
    finally:
        w.session.store.put(key, original)


def test_the_s3_table_covers_the_blob_attacks() -> None:
    blob_cells = {(k, a) for k in ("file blob", "tile") for a in ATTACKS}
    assert set(S3_CELLS) | set(S3_NOT_DETECTED) == blob_cells
