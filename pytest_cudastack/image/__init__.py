"""A deployment image read offline as a root directory the other floors inspect.

``store.py`` opens an image's blobs in a directory or a tar archive; ``manifest.py`` reads what the image is
(an OCI image layout, an oci-archive, a ``docker save`` tarball, legacy or OCI-hybrid; its index, manifest,
config and layers, digests checked); ``layers.py`` applies one layer's tar stream to a root directory the way
a container runtime's snapshotter does (whiteouts, links kept inside the root); ``rootfs.py`` materialises the
merged file system once per chain of layer digests in the cache directory, with each file's layer, and gives
the ``ImageRoot`` the stack is built on. Nothing in an image is executed.
"""

from __future__ import annotations

__all__: list[str] = []
