"""The expert's reason lines (03c_policies, 04_collect's teacher_reasons) over every task of every split, in the default
form and with each decision last (`decision_last`): grounded in the request and the pages shown, the same steps and
outcome as without them, one call per turn that the runner parses, and turns that fit the generation limit of the GPU
profiles."""
from __future__ import annotations
import pytest

from shopping_grpo.policies import ExpertPolicy, ungrounded_reasons, reason_kind
from shopping_grpo.episode import run_message_episode, generated_text
from shopping_grpo.tools import parse_reply
from _helpers import LANG, SIZES


@pytest.fixture(scope='module')
def plain(shop):
    "The expert's record without lines, of every task of every split."
    pol = ExpertPolicy(shop.catalog)
    return [run_message_episode(shop, t, pol, LANG) for s in SIZES for t in shop.tasks[s]]


@pytest.fixture(scope='module', params=['verdict_last', 'decision_last'])
def pairs(shop, plain, request):
    "(without, with) the lines in one form, the expert's record of every task of every split."
    said = ExpertPolicy(shop.catalog, reasons=True, decision_last=request.param == 'decision_last')
    return list(zip(plain, [run_message_episode(shop, t, said, LANG) for s in SIZES for t in shop.tasks[s]]))


def turns(rec) -> list[dict]: return [m for m in rec['messages'] if m['role'] == 'assistant']


def test_lines_are_grounded_in_the_request_and_the_pages(pairs):
    "No line uses a word that is neither the lines' own wording nor in the request or a page shown before it."
    bad = {r['task_id']: u for _, r in pairs if (u := ungrounded_reasons(r))}
    assert not bad, f'{len(bad)} episodes with ungrounded lines, e.g. {list(bad.items())[:2]}'


def test_lines_change_no_step_and_no_outcome(pairs):
    "With the lines the expert takes the same steps and gets the same reward; without them its turns are bare calls."
    assert [(p['steps'], p['reward'], p['flags']) for p, _ in pairs] == [(r['steps'], r['reward'], r['flags']) for _, r in pairs]
    assert {m['content'] for p, _ in pairs for m in turns(p)} == {''}


def test_every_turn_has_one_line_and_its_call(pairs):
    "Each turn is one line of a known kind ending in a newline, and its text as a model writes it parses to its call."
    for p, r in pairs:
        for a, b in zip(turns(p), turns(r)):
            assert b['content'].endswith('\n') and b['content'].count('\n') == 1 and reason_kind(b['content']), b['content']
            call, plain = parse_reply(generated_text(b)), parse_reply(a)
            assert (call.name, call.arguments) == (plain.name, plain.arguments)


def test_turn_tokens(pairs):
    "Line and call together stay under the h200 profiles' 128 new tokens with each materialised tokenizer."
    from transformers import AutoTokenizer
    from shopping_grpo.model import shopping_grpo_home, EMBEDDED_MODELS
    dirs = [d for m in ('smollm2', 'qwen2.5-0.5b') if (d := shopping_grpo_home()/'models'/EMBEDDED_MODELS[m].checkpoint).is_dir()]
    if not dirs: pytest.skip('no materialised model to take a tokenizer from')
    for d in dirs:
        tok = AutoTokenizer.from_pretrained(str(d))
        longest = max(len(tok.encode(generated_text(m), add_special_tokens=False)) for _, r in pairs for m in turns(r))
        assert longest < 128, (d.name, longest)


@pytest.mark.parametrize('pairs', ['decision_last'], indirect=True)
def test_decisions_follow_their_checks(pairs):
    """With `decision_last`, every price verdict is true, a row opened and a purchase are within the budget, and a row
    passed over is told up to the check it fails (its last part: a price over, another brand or no model)."""
    import re
    lines = [m['content'].strip() for _, r in pairs for m in turns(r)]
    verdicts = [(float(x), float(b), v) for l in lines for x, b, v in re.findall(r'price ([\d.]+) against ([\d.]+): (within|over)', l)]
    assert verdicts and all((x <= b) == (v == 'within') for x, b, v in verdicts)
    acted = [re.split(r'; passing over it\. ', l)[-1] for l in lines if reason_kind(l) in ('open_last', 'buy_last')]
    assert acted and not any(': over' in l for l in acted)
    passed = [m[1] for l in lines if reason_kind(l) == 'open_last' and (m := re.match(r'(.*?); passing over it\. ', l))]  # the line's first row
    assert passed and all(re.search(r'(: over|instead of \S+|no model \S+ in the title)$', p) for p in passed), passed[:3]
