"""The benchmark's baseline search engine: SQLite FTS5 BM25 over the same fields and weights as `SearchIndex`.

`FTS5Index` is a drop-in for `shopping_grpo.env.SearchIndex` as far as `ShopEnv` is concerned: it has
`.search(query, k=TOP_K) -> list[int]` returning catalog rows, best first. It indexes the exact text
`SearchIndex` indexes (`shopping_grpo.env._fields`), one FTS5 column per search field, and ranks with
`bm25(fts, w_title, w_brand, ...)` using the weights of `SEARCH_FIELDS`. Differences from ours, on purpose
kept small and stated: the Porter stemmer (FTS5 `porter`) instead of tantivy's Snowball `en_stem`, and no
popularity multiplier (FTS5's built-in bm25 cannot read one without a slower ORDER BY expression).
"""
from __future__ import annotations
import hashlib, json, sqlite3, time
from pathlib import Path
from shopping_grpo.env import INDEX_VERSION, SEARCH_FIELDS, TOP_K, Catalog, query_terms, _fields

COLUMNS = tuple(SEARCH_FIELDS)                                   # title, brand, category, model, attributes, options, bullets
RANK = f"bm25({', '.join(str(w) for w in SEARCH_FIELDS.values())})"  # same per-field weights as tantivy's boosts
SOURCE_COLS = ('title', 'brand', 'category_name', 'model', 'attributes', 'material', 'axes', 'bullets')


def fts5_path(catalog_dir, sha256: str, lang: str = 'en') -> Path:
    """Where the FTS5 index of the catalog with hash `sha256` lives: next to its parquet, keyed like `SearchIndex` by
    the catalog hash and the index version, and also by the field weights (stored in the file as its rank function)."""
    tag = hashlib.sha256(json.dumps([SEARCH_FIELDS, INDEX_VERSION]).encode()).hexdigest()[:8]
    return Path(catalog_dir)/f"fts5-{sha256[:16]}-{lang}-{tag}.sqlite"


def build_fts5(catalog: Catalog, path, batch: int = 20_000, progress=None) -> Path:
    "Index `catalog` into a contentless FTS5 table at `path` (rowid = catalog row); atomic, reused if READY."
    path = Path(path); ready = path.with_suffix('.ready')
    if path.exists() and ready.exists(): return path
    if catalog.lang != 'en': raise ValueError("the FTS5 baseline is English only (porter tokenizer)")
    tmp = path.with_suffix('.tmp'); tmp.unlink(missing_ok=True); path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(tmp)
    db.executescript("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;")
    db.execute(f"CREATE VIRTUAL TABLE fts USING fts5({', '.join(COLUMNS)}, content='', tokenize='porter unicode61')")
    db.execute("INSERT INTO fts(fts, rank) VALUES('rank', ?)", (RANK,))   # ORDER BY rank == weighted bm25
    cols, n, t0 = catalog.df.select(*SOURCE_COLS), len(catalog), time.time()
    sql = f"INSERT INTO fts(rowid, {', '.join(COLUMNS)}) VALUES (?{', ?'*len(COLUMNS)})"
    rows = cols.iter_rows(named=True); done = 0
    with db:
        while done < n:
            chunk = []
            for i, p in zip(range(done, min(n, done + batch)), rows):
                f = _fields(p); chunk.append((i, *(f[c] for c in COLUMNS)))
            db.executemany(sql, chunk); done += len(chunk)
            if progress: progress(f"fts5 {done:,}/{n:,} rows ({time.time() - t0:.0f}s)")
    db.execute("INSERT INTO fts(fts) VALUES('optimize')"); db.commit()   # one b-tree per term, like a merged segment
    db.close(); tmp.replace(path); ready.write_text(json.dumps(dict(n=n, sha256=catalog.sha256)))
    return path


def fts5_match(query: str) -> str:
    "An FTS5 MATCH expression with the same terms as our query: the words OR-ed, each quoted (no query syntax)."
    terms = list(dict.fromkeys(query_terms(query, 'en').split()))
    return ' OR '.join(f'"{t}"' for t in terms)


class FTS5Index:
    "FTS5 search with `SearchIndex`'s interface: `.search(query, k) -> list[int]` catalog rows, best first."
    def __init__(self, path):
        self.path = Path(path)
        # one connection; the HTTP service calls search from its event-loop thread, in-process from the caller's
        self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
        # give SQLite the memory-mapped reads tantivy gets, plus a 256 MiB page cache (the default is 2 MiB)
        self.db.execute("PRAGMA mmap_size=8589934592"); self.db.execute("PRAGMA cache_size=-262144")

    def search(self, query: str, k: int = TOP_K) -> list[int]:
        m = fts5_match(query)
        if not m: return []
        return [r for (r,) in self.db.execute("SELECT rowid FROM fts WHERE fts MATCH ? ORDER BY rank LIMIT ?", (m, k))]
