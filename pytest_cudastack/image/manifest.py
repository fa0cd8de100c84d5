"""What an image is: its layers in order (each with its digests and the ``history`` step that made it) and
its config, read from an OCI image layout (``oci-layout``, ``index.json``, ``blobs/sha256/``; directory or
oci-archive) or a ``docker save`` tarball (``manifest.json``: legacy ``<id>/layer.tar`` or Docker >= 25's OCI
hybrid). Every JSON blob is checked against its descriptor's digest and size here; layer blobs are checked
while they are read (``layers.py``).

Platform choice follows what ``docker pull``/containerd's default platform matcher does: an index's
manifests are matched on ``os``/``architecture`` (and ``variant`` when asked for), attestation manifests
(``vnd.docker.reference.type``) are never images, and a manifest whose descriptor has no platform is judged
by its config.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

from pytest_cudastack.image.store import JSON_LIMIT, BlobStore, ImageError, blob_path

__all__ = ["DEFAULT_PLATFORM", "ImageSource", "Layer", "read_source"]

DEFAULT_PLATFORM = "linux/amd64"
_INDEX = frozenset(
    {"application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json"}
)
_MANIFEST = frozenset(
    {"application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"}
)
_MAX_DEPTH = 8  # nested indexes (Docker >= 25 writes two levels)
_REF_KEYS = ("io.containerd.image.name", "org.opencontainers.image.ref.name")


@dataclass(frozen=True)
class Layer:
    """One layer: the archive member holding it, its blob ``digest`` (None for a legacy ``layer.tar``, which
    no descriptor names), its ``diff_id`` (the config's digest of the uncompressed tar) and the ``history``
    step that created it (``created_by``, the Dockerfile line)."""

    member: str
    digest: str | None
    diff_id: str | None
    size: int | None = None
    created_by: str = ""

    @property
    def name(self) -> str:
        """How messages name it: its digest (the diff_id for a legacy layer)."""
        return self.digest or self.diff_id or self.member


@dataclass(frozen=True)
class ImageSource:
    """An image as read from its files: ``kind`` (``oci-layout``, ``oci-archive``, ``docker-archive``),
    ``reference`` (its tag or ref name, else its path), ``manifest_digest`` (None for a legacy archive), the
    config document and the layers, bottom first."""

    path: str
    kind: str
    reference: str
    manifest_digest: str | None
    config: dict[str, Any]
    layers: tuple[Layer, ...]
    platform: str = DEFAULT_PLATFORM
    history: tuple[str, ...] = field(default=())

    @property
    def runtime_config(self) -> dict[str, Any]:
        """The config's ``config`` object (Env, Entrypoint, Cmd, WorkingDir), {} when absent."""
        inner = self.config.get("config")
        return inner if isinstance(inner, dict) else {}


def _verified_json(store: BlobStore, descriptor: Any, what: str) -> Any:
    """The JSON blob ``descriptor`` names, its bytes checked against the descriptor's digest and size."""
    if not isinstance(descriptor, dict):
        raise ImageError(f"{store.path}: {what}: a descriptor must be a JSON object")
    digest = descriptor.get("digest")
    name = blob_path(digest)
    with store.open(name) as f:
        try:
            raw = f.read(JSON_LIMIT + 1)
        except (OSError, EOFError) as e:
            raise ImageError(f"{store.path}: cannot read {what} {digest}: {e}") from e
    if len(raw) > JSON_LIMIT:
        raise ImageError(f"{store.path}: {what} {digest} is larger than {JSON_LIMIT} bytes")
    actual = "sha256:" + hashlib.sha256(raw).hexdigest()
    if actual != digest:
        raise ImageError(f"{store.path}: {what} {digest}: digest mismatch (the blob's bytes hash to {actual})")
    size = descriptor.get("size")
    if isinstance(size, int) and size != len(raw):
        raise ImageError(f"{store.path}: {what} {digest}: size {len(raw)}, descriptor says {size}")
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise ImageError(f"{store.path}: {what} {digest} is not JSON: {e}") from e


def _platform_of(value: Any) -> str | None:
    if not isinstance(value, dict) or not value.get("os") or not value.get("architecture"):
        return None
    parts = [str(value["os"]), str(value["architecture"])]
    if value.get("variant"):
        parts.append(str(value["variant"]))
    return "/".join(parts)


def _matches(found: str | None, wanted: str) -> bool:
    """``linux/arm64`` matches ``linux/arm64/v8``; a variant asked for must be the one found."""
    if found is None:
        return False
    f, w = found.split("/"), wanted.split("/")
    return f[:2] == w[:2] and (len(w) < 3 or (len(f) > 2 and f[2] == w[2]))


def _is_attestation(descriptor: dict[str, Any]) -> bool:
    annotations = descriptor.get("annotations")
    return isinstance(annotations, dict) and "vnd.docker.reference.type" in annotations


def _manifests(
    store: BlobStore, index: Any, where: str, depth: int = 0
) -> list[tuple[dict[str, Any], dict[str, Any], str | None]]:
    """Every image manifest an index reaches (nested indexes followed): ``(descriptor, manifest, platform)``."""
    if depth > _MAX_DEPTH:
        raise ImageError(f"{store.path}: indexes nested deeper than {_MAX_DEPTH}")
    entries = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(entries, list):
        raise ImageError(f"{store.path}: {where} has no manifests list")
    out: list[tuple[dict[str, Any], dict[str, Any], str | None]] = []
    for descriptor in entries:
        if not isinstance(descriptor, dict) or _is_attestation(descriptor):
            continue
        doc = _verified_json(store, descriptor, "manifest")
        kind = descriptor.get("mediaType") or (doc.get("mediaType") if isinstance(doc, dict) else None)
        if kind in _INDEX or (kind not in _MANIFEST and isinstance(doc, dict) and "manifests" in doc):
            for inner, manifest, platform in _manifests(store, doc, f"index {descriptor.get('digest')}", depth + 1):
                merged = dict(inner)
                merged.setdefault("annotations", descriptor.get("annotations") or {})
                out.append((merged, manifest, platform or _platform_of(descriptor.get("platform"))))
            continue
        if not isinstance(doc, dict) or not isinstance(doc.get("layers"), list):
            raise ImageError(f"{store.path}: manifest {descriptor.get('digest')} has no layers list")
        out.append((descriptor, doc, _platform_of(descriptor.get("platform"))))
    return out


def _history(config: dict[str, Any], count: int) -> tuple[str, ...]:
    """The ``created_by`` of each layer: the config's history entries that are not ``empty_layer``, in
    order, as many as there are layers ("" where the history is shorter)."""
    steps: list[str] = []
    history = config.get("history")
    for entry in history if isinstance(history, list) else ():
        if isinstance(entry, dict) and not entry.get("empty_layer"):
            steps.append(str(entry.get("created_by") or entry.get("comment") or ""))
    return tuple(steps[:count]) + ("",) * max(0, count - len(steps))


def _diff_ids(config: dict[str, Any], count: int, where: str) -> tuple[str | None, ...]:
    rootfs = config.get("rootfs")
    ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if not isinstance(ids, list):
        return (None,) * count
    if len(ids) != count:
        raise ImageError(f"{where}: the config lists {len(ids)} diff_ids for {count} layers")
    return tuple(str(i) for i in ids)


def _from_oci(store: BlobStore, kind: str, platform: str) -> ImageSource:
    index = store.read_json("index.json")
    found = _manifests(store, index, "index.json")
    chosen: tuple[dict[str, Any], dict[str, Any], dict[str, Any]] | None = None
    seen: list[str] = []
    for descriptor, manifest, declared in found:
        config = _verified_json(store, manifest.get("config"), "config")
        if not isinstance(config, dict):
            raise ImageError(f"{store.path}: config of manifest {descriptor.get('digest')} is not an object")
        actual = declared or _platform_of(config)
        seen.append(actual or "unknown")
        if _matches(actual, platform) or (actual is None and len(found) == 1):
            chosen = (descriptor, manifest, config)
            break
    if chosen is None:
        have = ", ".join(seen) or "none"
        raise ImageError(f"{store.path}: no image for platform {platform} (the index has: {have}); use --platform")
    descriptor, manifest, config = chosen
    descriptors = manifest["layers"]
    diff_ids = _diff_ids(config, len(descriptors), store.path)
    history = _history(config, len(descriptors))
    layers = []
    for i, layer in enumerate(descriptors):
        if not isinstance(layer, dict):
            raise ImageError(f"{store.path}: layer {i} of the manifest is not a descriptor")
        digest = layer.get("digest")
        size = layer.get("size") if isinstance(layer.get("size"), int) else None
        layers.append(Layer(blob_path(digest), digest, diff_ids[i], size, history[i]))
    annotations = descriptor.get("annotations") or {}
    ref = next((str(annotations[k]) for k in _REF_KEYS if isinstance(annotations, dict) and annotations.get(k)), "")
    return ImageSource(
        store.path,
        kind,
        ref or os.path.basename(store.path.rstrip("/")),
        str(descriptor.get("digest")),
        config,
        tuple(layers),
        platform,
        history,
    )


def _from_docker(store: BlobStore, platform: str) -> ImageSource:
    entries = store.read_json("manifest.json")
    if not isinstance(entries, list) or not entries or not isinstance(entries[0], dict):
        raise ImageError(f"{store.path}: manifest.json lists no image")
    seen: list[str] = []
    for entry in entries:
        config_name = entry.get("Config") if isinstance(entry, dict) else None
        members = entry.get("Layers") if isinstance(entry, dict) else None
        if not isinstance(config_name, str) or not isinstance(members, list):
            raise ImageError(f"{store.path}: manifest.json: an entry without Config and Layers")
        config = store.read_json(os.path.normpath(config_name))
        if not isinstance(config, dict):
            raise ImageError(f"{store.path}: {config_name} is not a JSON object")
        actual = _platform_of(config)
        seen.append(actual or "unknown")
        if actual is not None and not _matches(actual, platform) and len(entries) > 1:
            continue
        diff_ids = _diff_ids(config, len(members), store.path)
        history = _history(config, len(members))
        layers = []
        for i, member in enumerate(members):
            name = os.path.normpath(str(member))
            if name.startswith(("..", "/")):
                raise ImageError(f"{store.path}: manifest.json names a layer outside the archive: {member!r}")
            # an OCI-hybrid archive names blobs: their file name is the blob's digest
            digest = "sha256:" + name.rsplit("/", 1)[1] if name.startswith("blobs/sha256/") else None
            layers.append(Layer(name, digest, diff_ids[i], store.size(name), history[i]))
        tags = entry.get("RepoTags")
        ref = str(tags[0]) if isinstance(tags, list) and tags else os.path.basename(store.path)
        return ImageSource(store.path, "docker-archive", ref, None, config, tuple(layers), platform, history)
    raise ImageError(f"{store.path}: no image for platform {platform} (manifest.json has: {', '.join(seen)})")


def read_source(store: BlobStore, platform: str = DEFAULT_PLATFORM) -> ImageSource:
    """The image ``store`` holds: an OCI layout when it has ``oci-layout`` and ``index.json`` (a Docker >= 25
    archive is one, with a ``manifest.json`` beside), else a ``docker save`` legacy archive; ImageError when
    it is neither."""
    archive = os.path.isfile(store.path)
    if store.exists("oci-layout") and store.exists("index.json"):
        layout = store.read_json("oci-layout")
        if not isinstance(layout, dict) or layout.get("imageLayoutVersion") != "1.0.0":
            raise ImageError(f"{store.path}: oci-layout: imageLayoutVersion 1.0.0 expected")
        kind = ("docker-archive" if store.exists("manifest.json") else "oci-archive") if archive else "oci-layout"
        return _from_oci(store, kind, platform)
    if store.exists("manifest.json"):
        return _from_docker(store, platform)
    raise ImageError(
        f"{store.path}: not an image: no oci-layout and index.json (OCI image layout) and no manifest.json "
        "(docker save)"
    )
