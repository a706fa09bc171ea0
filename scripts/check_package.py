"""What `make build` checks before a package may be deployed: the function's bootstrap is a
64-bit Linux ELF for arm64 (aarch64), as the template's `Architectures` says; a package for
another architecture is refused. Prints its size, and its size zipped (what is uploaded).

Usage: check_package.py BOOTSTRAP      (exit 1 if it is not an arm64 ELF)
       check_package.py --self-test    (the check against headers made up for it)
"""

import os
import struct
import sys
import tempfile
import zlib

EM_AARCH64 = 183
MACHINES = {3: "x86", 40: "arm", 62: "x86_64", 183: "aarch64", 243: "riscv"}


def machine(path):
    """The ELF machine of the file at `path`, or why it is not a 64-bit little-endian ELF."""
    with open(path, "rb") as f:
        header = f.read(20)
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return None, "not an ELF file"
    if header[4] != 2 or header[5] != 1:
        return None, "not a 64-bit little-endian ELF"
    (e_machine,) = struct.unpack_from("<H", header, 18)
    return e_machine, MACHINES.get(e_machine, f"machine {e_machine}")


def check(path):
    e_machine, name = machine(path)
    if e_machine != EM_AARCH64:
        return f"{path} is {name}, not aarch64: the function runs on arm64 (template.yaml)"
    return None


def self_test():
    with tempfile.TemporaryDirectory() as folder:
        def elf(name, e_machine):
            path = os.path.join(folder, name)
            with open(path, "wb") as f:
                f.write(b"\x7fELF" + bytes([2, 1, 1]) + bytes(9) + struct.pack("<HH", 3, e_machine))
            return path
        assert check(elf("arm", EM_AARCH64)) is None
        assert "x86_64" in check(elf("x86", 62))
        script = os.path.join(folder, "script")
        with open(script, "w") as f:
            f.write("#!/bin/sh\n")
        assert "not an ELF" in check(script)
    print("check_package self-test: 3 passed, 0 failed")


def main(argv):
    if argv == ["--self-test"]:
        self_test()
        return 0
    [path] = argv
    problem = check(path)
    if problem:
        print(f"refused: {problem}", file=sys.stderr)
        return 1
    with open(path, "rb") as f:
        data = f.read()
    print(f"{path}: aarch64 ELF, {len(data):,} bytes, {len(zlib.compress(data, 9)):,} zipped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
