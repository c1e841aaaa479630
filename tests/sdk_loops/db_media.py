#!/usr/bin/env python3
"""How promptd's session database holds a medium: opens STATE/sessions.db read-only (the
daemon may still be running; WAL readers do not disturb it) and prints one line of JSON.

    db_media.py DB BASE64

{"tables": [names], "blobs": N or null when there is no `blobs` table,
 "blob_rows": [{"sha256", "bytes", "matches"}] (matches: the row's data is the medium, decoded
 or as its base64 text, and its key is the SHA-256 of either),
 "events_holding_base64": number of `events` rows whose body contains the base64 text,
 "events": number of `events` rows}

Standard library only.
"""

import base64
import hashlib
import json
import sqlite3
import sys


def main():
    path, text = sys.argv[1], sys.argv[2]
    decoded = base64.b64decode(text, validate=True)
    keys = {hashlib.sha256(decoded).hexdigest(), hashlib.sha256(text.encode()).hexdigest()}
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                       "ORDER BY name")]
    blobs, rows = None, []
    if "blobs" in tables:
        blobs = db.execute("SELECT count(*) FROM blobs").fetchone()[0]
        for sha, data in db.execute("SELECT sha256, data FROM blobs ORDER BY sha256"):
            raw = bytes(data) if isinstance(data, (bytes, memoryview)) else str(data).encode()
            rows.append({"sha256": sha, "bytes": len(raw),
                         "matches": raw in (decoded, text.encode()) and sha in keys})
    holding = db.execute("SELECT count(*) FROM events WHERE instr(body, ?) > 0",
                         (text,)).fetchone()[0]
    events = db.execute("SELECT count(*) FROM events").fetchone()[0]
    print(json.dumps({"tables": tables, "blobs": blobs, "blob_rows": rows,
                      "events_holding_base64": holding, "events": events}))


if __name__ == "__main__":
    main()
