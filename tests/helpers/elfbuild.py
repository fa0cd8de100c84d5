"""Build tiny real ELF files with the C compiler, for the elf/resolver/treeview tests (owner: core).

``build_lib`` compiles one shared library; ``build_scenarios`` lays out the loader scenarios the resolver
tests (and the ldd differential) use. Broken copies come from patching bytes (``patch``). Tests gate on
``needs_cc``.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = [
    "CC",
    "Scenarios",
    "build_exe",
    "build_lib",
    "build_scenarios",
    "get_scenarios",
    "link_args",
    "needs_cc",
    "needs_ldd",
    "patch",
    "retag",
    "synth_elf",
]

CC = shutil.which("cc") or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None, reason="needs a C compiler")
needs_ldd = pytest.mark.skipif(
    shutil.which("ldd") is None or not os.path.exists("/lib64/ld-linux-x86-64.so.2"),
    reason="needs ldd and the x86-64 dynamic linker",
)


def _cc(args: Sequence[str], cwd: Path) -> None:
    if CC is None:
        raise RuntimeError("no C compiler")
    proc = subprocess.run([CC, *args], cwd=cwd, capture_output=True, text=True, errors="replace", check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"cc {' '.join(args)} failed:\n{proc.stderr}")


def link_args(
    soname: str | None, needed: Sequence[Path], rpath: str | None, runpath: str | None, extra: Sequence[str]
) -> list[str]:
    args: list[str] = []
    if soname:
        args.append(f"-Wl,-soname,{soname}")
    if rpath is not None:
        args += ["-Wl,--disable-new-dtags", f"-Wl,-rpath,{rpath}"]
    if runpath is not None:
        args += ["-Wl,--enable-new-dtags", f"-Wl,-rpath,{runpath}"]
    args += ["-Wl,--no-as-needed", *(str(p) for p in needed), *extra]
    return args


def build_lib(
    out: Path,
    *,
    soname: str | None = None,
    needed: Sequence[Path] = (),
    rpath: str | None = None,
    runpath: str | None = None,
    extra: Sequence[str] = (),
    source: str | None = None,
) -> Path:
    """Compile a shared library at *out*. *needed* are library files linked in (DT_NEEDED = their soname).

    Set both *rpath* and *runpath* for an object with DT_RPATH and DT_RUNPATH (first -rpath is old-style).
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.parent / (out.name.replace(".", "_") + ".c")
    ident = "".join(c if c.isalnum() else "_" for c in out.name)
    src.write_text(source if source is not None else f"int fn_{ident}(void) {{ return 42; }}\n")
    args = ["-shared", "-fPIC", "-o", str(out), str(src)]
    if rpath is not None and runpath is not None:
        # GNU ld writes either tag, never both: write the RUNPATH string as DT_SONAME, then retag it
        if soname:
            raise ValueError("an object with both RPATH and RUNPATH gets no soname here")
        args += link_args(runpath, needed, rpath, None, extra)
        _cc(args, out.parent)
        retag(out, 14, 29)  # DT_SONAME -> DT_RUNPATH
    else:
        args += link_args(soname, needed, rpath, runpath, extra)
        _cc(args, out.parent)
    src.unlink()
    return out


def retag(path: Path, old: int, new: int) -> None:
    """Rewrite the first dynamic entry tagged *old* to tag *new* (ELF64 little-endian only)."""
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as f:
        dyn = ELFFile(f).get_section_by_name(".dynamic")
        assert dyn is not None, path
        offset, size = dyn["sh_offset"], dyn["sh_size"]
    with open(path, "r+b") as f:
        for pos in range(offset, offset + size, 16):
            f.seek(pos)
            if int.from_bytes(f.read(8), "little") == old:
                f.seek(pos)
                f.write(new.to_bytes(8, "little"))
                return
    raise ValueError(f"{path}: no dynamic tag {old}")


def build_exe(
    out: Path,
    *,
    needed: Sequence[Path] = (),
    rpath: str | None = None,
    runpath: str | None = None,
    extra: Sequence[str] = (),
) -> Path:
    """Compile a small executable at *out* linked against *needed*."""
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.parent / (out.name + "_main.c")
    src.write_text("int main(void) { return 0; }\n")
    args = ["-o", str(out), str(src), *link_args(None, needed, rpath, runpath, extra)]
    args += [f"-Wl,-rpath-link,{p.parent}" for p in needed]
    args += ["-Wl,--allow-shlib-undefined"]
    _cc(args, out.parent)
    src.unlink()
    return out


def patch(src: Path, dst: Path, offset: int, data: bytes) -> Path:
    """Copy *src* to *dst* and overwrite bytes at *offset*."""
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        f.seek(offset)
        f.write(data)
    return dst


@dataclass(frozen=True)
class Scenarios:
    """Paths of the built scenarios (roots to resolve), all under ``base``."""

    base: Path
    rpath_inherit: Path  # root RPATH=a:b; a/libmid needs libleaf (only in b): found via the root's RPATH
    runpath_not_inherited: Path  # same with RUNPATH: libleaf not found
    prec_rpath: Path  # RPATH=d_rpath; libprec in d_rpath, d_llp, d_runpath
    prec_runpath: Path  # RUNPATH=d_runpath
    prec_both: Path  # RPATH=d_rpath and RUNPATH=d_runpath: RPATH ignored
    d_rpath: Path
    d_llp: Path
    d_runpath: Path
    origin_link: Path  # symlink link/libo.so -> real/libo.so, RPATH $ORIGIN/deps; deps only in link/deps
    origin_mid: Path  # root needing libsym (found as a symlink) whose $ORIGIN/sub exists only beside the link
    nodeflib: Path  # -z nodefaultlib, needs libz.so.1 (system only)
    wrong_machine: Path  # RPATH=wm:good; wm/libwm.so has e_machine=AArch64
    wrong_class: Path  # RPATH=wc:good; wc/libwc.so has EI_CLASS=ELFCLASS32
    missing_deep: Path  # root -> libm1 -> libm2 -> libgone (deleted)
    not_elf_candidate: Path  # RPATH=junk:good; junk/libjunk.so is text: ld.so stops with an error
    dir_candidate: Path  # RPATH=dirs:good; dirs/libdir.so is a directory: ld.so stops with an error
    needs_slash: Path  # DT_NEEDED with a '/' and a DST: $ORIGIN/sub/libslash.so
    dedupe: Path  # root needs liblink (a symlink to libtarget, soname libtarget) and libtarget
    exe: Path  # an executable whose RPATH serves a library's dependency
    leaf: Path  # a plain library with soname libleaf.so.1 and PyInit_leaf
    refound: Path  # librx.so.1 missing for the root, found again through librq's RPATH
    loop_candidate: Path  # a symlink loop earlier on the RPATH list abandons that list


def build_scenarios(base: Path) -> Scenarios:
    """Build every scenario under *base* (a fresh directory)."""
    a, b = base / "a", base / "b"
    leaf = build_lib(
        b / "libleaf.so.1",
        soname="libleaf.so.1",
        source="int PyInit_libleaf(void) { return 0; }\nint helper(void) { return 1; }\n",
    )
    mid = build_lib(a / "libmid.so.1", soname="libmid.so.1", needed=[leaf])
    rpath_inherit = build_lib(base / "r1" / "librpath.so", needed=[mid], rpath=f"{a}:{b}")
    runpath_ni = build_lib(base / "r2" / "librunpath.so", needed=[mid], runpath=f"{a}:{b}")

    d_rpath, d_llp, d_runpath = base / "p_rpath", base / "p_llp", base / "p_runpath"
    prec = [build_lib(d / "libprec.so.1", soname="libprec.so.1") for d in (d_rpath, d_llp, d_runpath)]
    prec_rpath = build_lib(base / "p" / "libprec_rpath.so", needed=[prec[0]], rpath=str(d_rpath))
    prec_runpath = build_lib(base / "p" / "libprec_runpath.so", needed=[prec[0]], runpath=str(d_runpath))
    prec_both = build_lib(base / "p" / "libprec_both.so", needed=[prec[0]], rpath=str(d_rpath), runpath=str(d_runpath))

    real, link = base / "o_real", base / "o_link"
    odep = build_lib(link / "deps" / "libodep.so.1", soname="libodep.so.1")
    oreal = build_lib(real / "libo.so", needed=[odep], rpath="$ORIGIN/deps")
    (link / "libo.so").symlink_to(oreal)
    origin_link = link / "libo.so"

    s_real, s_link = base / "s_real", base / "s_link"
    sdep = build_lib(s_link / "sub" / "libsdep.so.1", soname="libsdep.so.1")
    sreal = build_lib(s_real / "libsym.so.1", soname="libsym.so.1", needed=[sdep], rpath="${ORIGIN}/sub")
    (s_link / "libsym.so.1").symlink_to(sreal)
    origin_mid = build_lib(base / "s_root" / "libsroot.so", needed=[sreal], rpath=str(s_link))

    libz = Path("/lib/x86_64-linux-gnu/libz.so.1")
    if not libz.exists():
        libz = Path("/usr/lib/x86_64-linux-gnu/libz.so.1")
    nodeflib = build_lib(base / "nd" / "libnodef.so", needed=[libz], extra=["-Wl,-z,nodefaultlib"])

    good = base / "good"
    wm_good = build_lib(good / "libwm.so", soname="libwm.so")
    (base / "wm").mkdir()
    patch(wm_good, base / "wm" / "libwm.so", 18, (183).to_bytes(2, "little"))
    wrong_machine = build_lib(base / "wmroot" / "libwmroot.so", needed=[wm_good], rpath=f"{base / 'wm'}:{good}")
    wc_good = build_lib(good / "libwc.so", soname="libwc.so")
    (base / "wc").mkdir()
    patch(wc_good, base / "wc" / "libwc.so", 4, b"\x01")
    wrong_class = build_lib(base / "wcroot" / "libwcroot.so", needed=[wc_good], rpath=f"{base / 'wc'}:{good}")

    gone = build_lib(base / "m" / "libgone.so.1", soname="libgone.so.1")
    m2 = build_lib(base / "m" / "libm2.so.1", soname="libm2.so.1", needed=[gone], rpath="$ORIGIN")
    m1 = build_lib(base / "m" / "libm1.so.1", soname="libm1.so.1", needed=[m2], rpath="$ORIGIN")
    missing_deep = build_lib(base / "mroot" / "libmroot.so", needed=[m1], rpath=str(base / "m"))
    gone.unlink()

    junk_good = build_lib(good / "libjunk.so", soname="libjunk.so")
    (base / "junk").mkdir()
    (base / "junk" / "libjunk.so").write_text("INPUT(-lc)\n")
    not_elf = build_lib(base / "jroot" / "libjroot.so", needed=[junk_good], rpath=f"{base / 'junk'}:{good}")
    dir_good = build_lib(good / "libdir.so", soname="libdir.so")
    (base / "dirs" / "libdir.so").mkdir(parents=True)
    dir_cand = build_lib(base / "droot" / "libdroot.so", needed=[dir_good], rpath=f"{base / 'dirs'}:{good}")

    # DT_NEEDED "$ORIGIN/sub/libslash.so": a name with '/' (and a DST), opened without a search
    slash_dep = build_lib(base / "sl" / "sub" / "libslash.so", soname="$ORIGIN/sub/libslash.so")
    slash_root = build_lib(base / "sl" / "libslashroot.so", needed=[slash_dep])

    target = build_lib(base / "dd" / "libtarget.so.1", soname="libtarget.so.1")
    (base / "dd" / "liblink.so").symlink_to("libtarget.so.1")
    dd_link_src = build_lib(base / "ddbuild" / "liblink.so", soname="liblink.so")
    dedupe = build_lib(base / "ddroot" / "libddroot.so", needed=[dd_link_src, target], rpath=str(base / "dd"))

    # root (RUNPATH=ry) needs librx (not on its path) then librq (in ry, RPATH=rx): ld.so marks librx
    # missing for root, then finds it again for librq
    rx = build_lib(base / "rx" / "librx.so.1", soname="librx.so.1")
    rq = build_lib(base / "ry" / "librq.so.1", soname="librq.so.1", needed=[rx], rpath=str(base / "rx"))
    refound = build_lib(base / "rroot" / "librroot.so", needed=[rx, rq], runpath=str(base / "ry"))

    # RPATH=loopd:good, loopd/liblp.so is a symlink loop: open() fails with ELOOP, which makes ld.so
    # abandon the rest of the RPATH list (good/ is never tried); LD_LIBRARY_PATH would still find it
    lp_good = build_lib(good / "liblp.so", soname="liblp.so")
    (base / "loopd").mkdir()
    (base / "loopd" / "liblp.so").symlink_to("l2.so")
    (base / "loopd" / "l2.so").symlink_to("liblp.so")
    loop_candidate = build_lib(base / "lproot" / "liblproot.so", needed=[lp_good], rpath=f"{base / 'loopd'}:{good}")

    exe_dep = build_lib(base / "x_dep" / "libxdep.so.1", soname="libxdep.so.1")
    x_mid = build_lib(base / "x_mid" / "libxmid.so.1", soname="libxmid.so.1", needed=[exe_dep])
    exe = build_exe(base / "x_bin" / "prog", needed=[x_mid], rpath=f"{base / 'x_mid'}:{base / 'x_dep'}")

    return Scenarios(
        base=base,
        rpath_inherit=rpath_inherit,
        runpath_not_inherited=runpath_ni,
        prec_rpath=prec_rpath,
        prec_runpath=prec_runpath,
        prec_both=prec_both,
        d_rpath=d_rpath,
        d_llp=d_llp,
        d_runpath=d_runpath,
        origin_link=origin_link,
        origin_mid=origin_mid,
        nodeflib=nodeflib,
        wrong_machine=wrong_machine,
        wrong_class=wrong_class,
        missing_deep=missing_deep,
        not_elf_candidate=not_elf,
        dir_candidate=dir_cand,
        needs_slash=slash_root,
        dedupe=dedupe,
        exe=exe,
        leaf=leaf,
        refound=refound,
        loop_candidate=loop_candidate,
    )


_BUILT: dict[str, Scenarios] = {}


def get_scenarios(tmp_path_factory: pytest.TempPathFactory) -> Scenarios:
    """Every loader scenario, compiled once per process (skips without a C compiler). Test modules wrap
    this in a session-scoped fixture."""
    if CC is None:
        pytest.skip("needs a C compiler")
    if "s" not in _BUILT:
        _BUILT["s"] = build_scenarios(tmp_path_factory.mktemp("elfscen"))
    return _BUILT["s"]


def synth_elf(
    out: Path,
    *,
    elf_class: int = 64,
    little: bool = True,
    machine: int = 62,
    soname: str | None = "libsynth.so.1",
    needed: Sequence[str] = ("libc.so.6",),
    rpath: str | None = None,
    runpath: str | None = None,
    nodeflib: bool = False,
    interpreter: str | None = None,
    verneed: Sequence[tuple[str, Sequence[str]]] = (),
    sections: bool = True,
    extra_sections: Sequence[str] = (),
    pyinit: str | None = None,
) -> Path:
    """Write a minimal, well-formed ELF shared object of any class and byte order (no compiler needed).

    Layout: ELF header, program headers (PT_LOAD over the whole file at vaddr 0x10000, PT_DYNAMIC,
    PT_INTERP), .interp, .dynstr, .dynamic, .gnu.version_r, .dynsym + .hash (SysV, defining
    ``PyInit_<pyinit>``), empty *extra_sections* (e.g. ``.nv_fatbin``), .shstrtab and the section header
    table (omitted with ``sections=False``, as sstrip does).
    """
    import struct

    e = "<" if little else ">"
    b64 = elf_class == 64
    base = 0x10000
    strtab = bytearray(b"\0")

    def s(text: str) -> int:
        off = len(strtab)
        strtab.extend(text.encode() + b"\0")
        return off

    dyn: list[tuple[int, int]] = [(1, s(n)) for n in needed]
    if soname is not None:
        dyn.append((14, s(soname)))
    if rpath is not None:
        dyn.append((15, s(rpath)))
    if runpath is not None:
        dyn.append((29, s(runpath)))
    if nodeflib:
        dyn.append((0x6FFFFFFB, 0x800))
    vn = bytearray()
    for i, (file, versions) in enumerate(verneed):
        last = i == len(verneed) - 1
        vn += struct.pack(e + "HHIII", 1, len(versions), s(file), 16, 0 if last else 16 + 16 * len(versions))
        for j, v in enumerate(versions):
            vn += struct.pack(e + "IHHII", 0, 0, 2 + j, s(v), 0 if j == len(versions) - 1 else 16)
    sym_name = s(f"PyInit_{pyinit}") if pyinit else 0
    ehsize, phentsize, shentsize = (64, 56, 64) if b64 else (52, 32, 40)
    phnum = 3 if interpreter is not None else 2
    off = ehsize + phnum * phentsize
    blobs: list[tuple[str, int, bytes, int, int, int]] = []  # name, type, data, link, info, entsize

    def add(name: str, sh_type: int, data: bytes, link: int = 0, info: int = 0, entsize: int = 0) -> int:
        blobs.append((name, sh_type, data, link, info, entsize))
        return len(blobs)  # section index (0 is the null section)

    if interpreter is not None:
        add(".interp", 1, interpreter.encode() + b"\0")
    symsize = 24 if b64 else 16
    syms = bytes(symsize)
    if pyinit:
        if b64:
            syms += struct.pack(e + "IBBHQQ", sym_name, 0x12, 0, 5, base, 0)
        else:
            syms += struct.pack(e + "IIIBBH", sym_name, base, 0, 0x12, 0, 5)
    # order: [.interp] .dynstr .dynamic [.gnu.version_r] .dynsym .hash extras
    dynstr_idx = add(".dynstr", 3, b"")  # data filled in once every string is known
    dynamic_idx = add(".dynamic", 6, b"", link=dynstr_idx, entsize=16 if b64 else 8)
    if vn:
        add(".gnu.version_r", 0x6FFFFFFE, bytes(vn), link=dynstr_idx, info=len(verneed))
    dynsym_idx = add(".dynsym", 11, syms, link=dynstr_idx, info=1, entsize=symsize)
    nsyms = len(syms) // symsize
    h = 0
    for c in f"PyInit_{pyinit}".encode():
        h = ((h << 4) + c) & 0xFFFFFFFF
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
        h &= ~g & 0xFFFFFFFF
    chains = [0] * nsyms
    bucket = [1 if pyinit else 0]
    add(".hash", 5, struct.pack(e + f"II{len(bucket)}I{nsyms}I", 1, nsyms, *bucket, *chains), link=dynsym_idx)
    for name in extra_sections:
        add(name, 1, b"\0" * 8)
    # lay out the section data; .dynstr and .dynamic get their final bytes now
    offsets: list[int] = []
    pos = off
    dyn_entries = [*dyn]
    for i, (name, sh_type, _data, link, info, entsize) in enumerate(blobs):
        pos = (pos + 7) & ~7
        offsets.append(pos)
        if name == ".dynstr":
            blobs[i] = (name, sh_type, bytes(strtab), link, info, entsize)
            dyn_entries.append((5, base + pos))  # DT_STRTAB
            dyn_entries.append((10, len(strtab)))  # DT_STRSZ
            dyn_entries.append((0, 0))
        elif name == ".dynamic":
            fmt = e + ("qQ" if b64 else "iI")
            blobs[i] = (name, sh_type, b"".join(struct.pack(fmt, t, v) for t, v in dyn_entries), link, info, entsize)
        pos += len(blobs[i][2])
    shstr = bytearray(b"\0")
    name_offs = []
    for name, *_ in blobs:
        name_offs.append(len(shstr))
        shstr.extend(name.encode() + b"\0")
    shstr_name = len(shstr)
    shstr.extend(b".shstrtab\0")
    pos = (pos + 7) & ~7
    shstr_off = pos
    pos += len(shstr)
    pos = (pos + 7) & ~7
    shoff = pos if sections else 0
    shnum = len(blobs) + 2 if sections else 0
    total = pos + (shnum * shentsize if sections else 0)
    img = bytearray(total)
    ident = b"\x7fELF" + bytes([2 if b64 else 1, 1 if little else 2, 1, 0]) + bytes(8)
    ehdr_fmt = e + ("16sHHIQQQIHHHHHH" if b64 else "16sHHIIIIIHHHHHH")
    img[0:ehsize] = struct.pack(
        ehdr_fmt,
        ident,
        3,
        machine,
        1,
        0,
        ehsize,
        shoff,
        0,
        ehsize,
        phentsize,
        phnum,
        shentsize,
        shnum,
        shnum - 1 if sections else 0,
    )
    dyn_i = dynamic_idx - 1
    phdrs = [(1, 0, base, total), (2, offsets[dyn_i], base + offsets[dyn_i], len(blobs[dyn_i][2]))]
    if interpreter is not None:
        phdrs.insert(0, (3, offsets[0], base + offsets[0], len(blobs[0][2])))
    for k, (pt, poff, vaddr, size) in enumerate(phdrs):
        if b64:
            ph = struct.pack(e + "IIQQQQQQ", pt, 4, poff, vaddr, vaddr, size, size, 8)
        else:
            ph = struct.pack(e + "IIIIIIII", pt, poff, vaddr, vaddr, size, size, 4, 4)
        img[ehsize + k * phentsize : ehsize + (k + 1) * phentsize] = ph
    for (_name, _t, data, *_rest), o in zip(blobs, offsets, strict=True):
        img[o : o + len(data)] = data
    img[shstr_off : shstr_off + len(shstr)] = shstr
    if sections:
        shdr_fmt = e + ("IIQQQQIIQQ" if b64 else "IIIIIIIIII")
        rows = [(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)]
        for (_name, sh_type, data, link, info, entsize), o, no in zip(blobs, offsets, name_offs, strict=True):
            rows.append((no, sh_type, 2, base + o, o, len(data), link, info, 8, entsize))
        rows.append((shstr_name, 3, 0, 0, shstr_off, len(shstr), 0, 0, 1, 0))
        for k, row in enumerate(rows):
            img[shoff + k * shentsize : shoff + (k + 1) * shentsize] = struct.pack(shdr_fmt, *row)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(bytes(img))
    return out


def sparse_gnu_hash_elf(path: Path, tail: int, *, end_at: int | None = None, little: bool = True) -> None:
    """An ELF64 shared object whose DT_GNU_HASH has one bucket (symbol 1) and a chain of *tail* bytes of
    zero words (a sparse file: the chain never ends), or ending at chain word *end_at*."""
    e = "<" if little else ">"
    ph_off, dyn_off, str_off, sym_off, hash_off = 64, 0x100, 0x200, 0x300, 0x400
    chain_off = hash_off + 16 + 8 + 4  # header, one bloom word, one bucket
    size = chain_off + tail
    head = b"\x7fELF" + bytes([2, 1 if little else 2, 1]) + bytes(9)
    head += struct.pack(e + "HHIQQQIHHHHHH", 3, 62, 1, 0, ph_off, 0, 0, 64, 56, 2, 64, 0, 0)
    phdrs = struct.pack(e + "IIQQQQQQ", 1, 5, 0, 0, 0, size, size, 0x1000)  # PT_LOAD over the file
    phdrs += struct.pack(e + "IIQQQQQQ", 2, 6, dyn_off, dyn_off, dyn_off, 0x60, 0x60, 8)  # PT_DYNAMIC
    dyn = b"".join(
        struct.pack(e + "qQ", t, v)
        for t, v in [(0x6FFFFEF5, hash_off), (6, sym_off), (5, str_off), (10, 1), (11, 24), (0, 0)]
    )
    gnu = struct.pack(e + "IIIIQI", 1, 1, 1, 6, 0, 1)
    with open(path, "wb") as f:
        f.truncate(size)
        for off, data in [(0, head), (ph_off, phdrs), (dyn_off, dyn), (hash_off, gnu)]:
            f.seek(off)
            f.write(data)
        if end_at is not None:
            f.seek(chain_off + 4 * end_at)
            f.write(struct.pack(e + "I", 1))
