"""A headless Chromium for the tests of the HTML pages mtx writes (mtx inspect, mtx report), and a PNG reader
for its screenshots, with the standard library alone. Without a `chromium` or `chromium-browser` binary the
browser tests are skipped (CHROMIUM is None)."""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(*args: str, folder: Path) -> subprocess.CompletedProcess:
    """Chromium run headless on `args`, with a profile of its own under `folder`."""
    command = [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={folder / 'profile'}",
               "--hide-scrollbars", "--force-device-scale-factor=1", "--virtual-time-budget=5000", *args]
    return subprocess.run(command, capture_output=True, timeout=120, check=True)


def png_pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit RGB or RGBA PNG, unfiltered (PNG spec §9)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    position, chunks, header = 8, [], b""
    while position < len(png):
        length, kind = struct.unpack(">I4s", png[position:position + 8])
        body = png[position + 8:position + 8 + length]
        header = body if kind == b"IHDR" else header
        chunks += [body] if kind == b"IDAT" else []
        position += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and color in (2, 6)
    step = 3 if color == 2 else 4
    raw, rows, previous = zlib.decompress(b"".join(chunks)), [], bytes(width * step)
    for y in range(height):
        line = raw[y * (width * step + 1):(y + 1) * (width * step + 1)]
        kind, data, out = line[0], line[1:], bytearray(width * step)
        for i, value in enumerate(data):
            left = out[i - step] if i >= step else 0
            up, corner = previous[i], previous[i - step] if i >= step else 0
            if kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                value += left if pa <= pb and pa <= pc else up if pb <= pc else corner
            else:
                value += (0, left, up, (left + up) // 2)[kind]
            out[i] = value & 0xFF
        rows.append(bytes(out))
        previous = out
    return width, height, rows
