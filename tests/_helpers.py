"""Helpers and fakes shared by the test modules (imported as `_helpers`)."""
from __future__ import annotations
import copy, json, shutil, sys
from pathlib import Path

N_PRODUCTS, SEED, TASK_SEED, LANG = 3000, 0, 1, 'en'   # the session shop (see conftest.py)
SIZES = dict(sft=60, grpo_train=40, grpo_val=20, eval=40)

# the browser tests (report, docs site): Debian's Chromium, headless, through Playwright; they skip without it
CHROMIUM = shutil.which('chromium') or shutil.which('chromium-browser')
NO_CHROMIUM = "no Chromium to drive: install Debian's package (apt-get install chromium) to run the browser tests"
CHROMIUM_FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
                  '--disable-component-update', '--disable-sync', '--no-first-run']


def launched_chromium(sync_api):
    "Yield a headless Chromium for a module's tests, closed after them (the `browser` fixtures)."
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield b
        b.close()


def open_page(browser, path, errors:list):
    "A page showing the file at `path`; JavaScript errors and console errors are appended to `errors`."
    page = browser.new_page(viewport={'width': 1400, 'height': 900})
    page.on('pageerror', lambda e: errors.append(f'{Path(str(path)).name}: {e}'))
    page.on('console', lambda m: errors.append(f'{Path(str(path)).name}: {m.text}') if m.type == 'error' else None)
    page.goto(path if str(path).startswith('file:') else Path(path).as_uri())
    return page


def replay(shop, task, actions):
    "Observation states (reset state first) and the final step result of `actions` played in-process."
    env = shop.env(); states = [copy.deepcopy(env.reset(task.instruction, task))]; r = None
    for a in actions:
        r = env.step(a); states.append(copy.deepcopy(r.state))
    return states, r, env


def as_json(x):
    "`x` as it comes back from a JSON round trip."
    return json.loads(json.dumps(x))


class ScriptedTokens:
    "A token policy replaying shoppers' episodes: each new episode follows the next shopper in turn."
    def __init__(self, shop, renderer, tasks, policies, lang:str='en', recipe=None):
        from collections import defaultdict
        from shopping_grpo.episode import played
        from shopping_grpo.grpo import GRPORecipe
        c = recipe or GRPORecipe()
        self.scripts = defaultdict(list)  # prompt ids -> [(full ids, turns)] per policy
        for t in tasks:
            for p in policies:
                te = played(shop, t, p, renderer, lang, c.max_turns, max_context=c.max_context,
                            max_new_tokens=c.max_new_tokens)
                turns = [te.response_ids[a:b] for a, b in te.turns]
                self.scripts[tuple(te.prompt_ids)].append((te.prompt_ids + te.response_ids, turns))
        self.end_id, self.k, self.generated, self.gen_seconds, self.temperature = renderer.end_id, 0, 0, 0.0, 1.0

    def __call__(self, contexts:list[list[int]]) -> list[list[int]]:
        "Each context's next turn from the script it follows (a prompt alone starts the next script in turn)."
        out = []
        for c in contexts:
            p = next(p for p in self.scripts if tuple(c[:len(p)]) == p)
            runs = [r for r in self.scripts[p] if r[0][:len(c)] == c]
            if len(c) == len(p):
                runs = [runs[self.k % len(runs)]]
                self.k += 1
            out.append(runs[0][1][c[len(p):].count(self.end_id) // 2])
        self.generated += sum(map(len, out))
        return out


STAND_IN = """import http.server, json, subprocess, sys
port, name = sys.argv[sys.argv.index('--port') + 1], sys.argv[sys.argv.index('--served-model-name') + 1]
served = name if READY else 'not-yet'
subprocess.Popen(['sleep', '300'])  # an engine process of the same group
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({'data': [{'id': served}]}).encode() if self.path == '/v1/models' else b'{}'
        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(('127.0.0.1', int(port)), H).serve_forever()
"""


def stand_in_python(folder:Path, ready:bool=True) -> Path:
    "A vLLM python stand-in: answers the CUDA probe with False and serves `--served-model-name` (or never does)."
    (folder/'server.py').write_text(STAND_IN.replace('READY', str(ready)))
    py = folder/'python'
    py.write_text(f'#!/bin/sh\ncase "$*" in *torch.cuda*) echo False;; *) exec {sys.executable} {folder/"server.py"} "$@";; esac\n')
    py.chmod(0o755)
    return py
