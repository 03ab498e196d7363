"""Requests in varied wording: reproducible from the seed, the same tasks and unique targets as the template wording, a
budget that always states the facts' bound, held-out styles kept out of training, a free-form benchmark that
refuses a modified file, and a human benchmark of the same tasks whose requests, written by hand, each state
their task's facts."""
from __future__ import annotations
import json, random, re, shutil
import pytest

from shopping_grpo.env import Catalog, build_catalog, LANGS
from dataclasses import replace
from shopping_grpo.tasks import (make_tasks, verify_task, CategoryIndex, wording_styles, word_varied, reword_tasks,
                                 read_tasks, load_benchmark, benchmark_file, STYLE_SPLITS, human_tasks, human_requests,
                                 human_words, request_problems, wording_variety)
from shopping_grpo.records import data_dir
from shopping_grpo.evaluate import verify_benchmark, BenchmarkMismatch
from _helpers import N_PRODUCTS, SEED, TASK_SEED

SIZES = dict(sft=40, grpo_train=20, grpo_val=10, eval=30)
TRAINING = ('sft', 'grpo_train', 'grpo_val')


@pytest.fixture(scope='module')
def catalogs(tmp_path_factory):
    "The small catalog of the test session's shop, in both languages (no index: only the catalog is needed)."
    d = tmp_path_factory.mktemp('wording') / 'catalog'
    build_catalog(d, N_PRODUCTS, SEED, progress=False)
    return {lg: Catalog.load(d, lg) for lg in LANGS}


@pytest.fixture(scope='module')
def made(catalogs):
    "lang -> (template tasks, varied tasks) of the small shop."
    return {lg: (make_tasks(c, SIZES, TASK_SEED, lg), make_tasks(c, SIZES, TASK_SEED, lg, wording='varied'))
            for lg, c in catalogs.items()}


# ---- a reference reader of budgets, written independently of the generator's number formatting
EN_WORDS = {w: i for i, w in enumerate('zero one two three four five six seven eight nine ten eleven twelve thirteen '
                                       'fourteen fifteen sixteen seventeen eighteen nineteen'.split())}
EN_WORDS |= {w: 10 * i for i, w in enumerate('_ _ twenty thirty forty fifty sixty seventy eighty ninety'.split()) if i > 1}
ZH_DIGITS = dict(zip('零一二两三四五六七八九', [0, 1, 2, 2, 3, 4, 5, 6, 7, 8, 9]))
ZH_UNITS = {'十': 10, '百': 100, '千': 1000}
EN_RUN = re.compile(r'\b(?:(?:' + '|'.join(sorted(EN_WORDS, key=len, reverse=True)) +
                    r'|hundred|thousand)(?:[ -]+(?:and +)?)?)+\b', re.I)
ZH_RUN = re.compile(r'[零一二两三四五六七八九十百千]+')
AMOUNT = re.compile(r'(?<![A-Za-z0-9_.\-])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?k|\d+)(?![A-Za-z0-9_\-])')
BEFORE = re.compile(r'(no more than|at most|max|up to|under|over|more than|cap|<=|≤|¥|budget(?: is)?|不超过|最多|别超过|预算)\s*$')
AFTER = re.compile(r'\s*(yuan|rmb|块|元|tops|max|is the ceiling|is my limit|以内|封顶|是上限|以下)')
HOPE = re.compile(r'(about|around)\s*¥?\s*$')


def en_value(words:str) -> int:
    total = cur = 0
    for w in re.split(r'[ -]+', words.lower().strip(' -')):
        if w in EN_WORDS: cur += EN_WORDS[w]
        elif w == 'hundred': cur *= 100
        elif w == 'thousand': total, cur = total + cur * 1000, 0
    return total + cur


def zh_value(s:str) -> int:
    total = cur = 0
    last = None
    for ch in s:
        if ch in ZH_DIGITS: cur = ZH_DIGITS[ch]
        else: total, cur, last = total + (cur or 1) * ZH_UNITS[ch], 0, ZH_UNITS[ch]
    return total + cur * (last // 10 if last else 1)  # '一百五' is 150, '一千四' 1400


def read_budget(text:str) -> tuple[set[float], set[float]]:
    "The bounds a request states and the loose figures it hopes for, as numbers."
    text = EN_RUN.sub(lambda m: f'{en_value(m.group(0))}' + (' ' if m.group(0).endswith(' ') else ''), text)
    text = ZH_RUN.sub(lambda m: str(zh_value(m.group(0))), text)
    bounds, hopes = set(), set()
    for m in AMOUNT.finditer(text):
        s = m.group(1).replace(',', '')
        v = float(s[:-1]) * 1000 if s.endswith('k') else float(s)
        left, right = text[max(0, m.start() - 20):m.start()].lower(), text[m.end():m.end() + 16].lower()
        if HOPE.search(left) or right.startswith('左右'): hopes.add(v)
        elif BEFORE.search(left) or AFTER.match(right): bounds.add(v)
    return bounds, hopes


def test_reference_reader():
    "The reader itself, on requests a person might write."
    assert read_budget("a kettle from Lumora, 1,428 tops") == ({1428.0}, set())
    assert read_budget("hoping for about 170, but two hundred yuan is my limit") == ({200.0}, {170.0})
    assert read_budget("收连衣裙，一千四以内，42码") == ({1400.0}, set())
    assert read_budget("the JN 579, size 42, 20000 mah") == (set(), set())


def test_same_tasks_and_reproducible(made, catalogs):
    "Varied wording changes only the requests: same ids and facts; the same seed gives the same words."
    for lg, (tpl, var) in made.items():
        for s in SIZES:
            assert [(t.task_id, t.facts) for t in tpl[s]] == [(t.task_id, t.facts) for t in var[s]]
            assert [t.instruction for t in tpl[s]] != [t.instruction for t in var[s]]
        again = make_tasks(catalogs[lg], SIZES, TASK_SEED, lg, wording='varied')
        assert [t.as_dict() for s in SIZES for t in again[s]] == [t.as_dict() for s in SIZES for t in var[s]]
        assert all('wording' not in t.as_dict() for s in SIZES for t in tpl[s])  # template files keep their bytes
        other = reword_tasks(tpl['eval'], catalogs[lg], TASK_SEED + 1)
        assert [t.instruction for t in other] != [t.instruction for t in var['eval']]


def test_targets_stay_unique(made, catalogs):
    "Every varied task passes the frozen benchmark's checks: its target is the unique product meeting its facts."
    for lg, (_, var) in made.items():
        cats = CategoryIndex(catalogs[lg])
        assert [t.task_id for s in SIZES for t in var[s] if verify_task(t, catalogs[lg], cats)] == []


def test_budget_states_the_bound(made, catalogs):
    "Every style states exactly the facts' bound, never a looser one; a hoped-for figure lies below it."
    checked = 0
    for lg, (tpl, _) in made.items():
        tasks = [t for s in SIZES for t in tpl[s]]
        for style in wording_styles(lg):
            for i, t in enumerate(tasks):
                p = catalogs[lg].by_asin(t.facts.target_asin)
                text = word_varied(t.facts, p, lg, random.Random(i), style)
                shown = [a['values'][a['value_keys'].index(t.facts.options[a['key']])] for a in p['axes'] or []
                         if a['key'] in t.facts.options]
                if any('块' in o for o in shown):  # '300块' pieces: then money is never written in 块
                    assert text.count('块') == sum(text.count(o) * o.count('块') for o in shown), text
                for o in shown: text = text.replace(o, ' ')  # option values are catalog words, not amounts
                bounds, hopes = read_budget(text)
                want = {t.facts.budget} if t.facts.budget is not None else set()
                assert bounds == want, (style['id'], text, t.facts.budget)
                assert all(h < t.facts.budget for h in hopes), (style['id'], text)
                checked += t.facts.budget is not None
    assert checked > 500


def test_heldout_styles_stay_out_of_training(made, tmp_path):
    "Training splits use training styles only, the eval split held-out ones; a styles file sharing a template is refused."
    for lg, (_, var) in made.items():
        train, held = ({s['id'] for s in wording_styles(lg, sp)} for sp in STYLE_SPLITS)
        assert train and held and not train & held
        assert {t.wording for s in TRAINING for t in var[s]} <= train
        assert {t.wording for t in var['eval']} <= held
    styles = json.loads((data_dir().parent/'shopping_grpo'/'data'/'wording_styles.json').read_text('utf-8'))
    held = next(s for s in styles['styles'] if s['split'] == 'heldout' and s['lang'] == 'en')
    train = next(s for s in styles['styles'] if s['split'] == 'train' and s['lang'] == 'en')
    held['open'].append(train['open'][0])
    (tmp_path/'styles.json').write_text(json.dumps(styles, ensure_ascii=False))
    with pytest.raises(ValueError, match='share templates with training'):
        wording_styles('en', path=tmp_path/'styles.json')


def assert_an_edited_copy_is_refused(tmp_path, catalogs, benchmark:str, lang:str='en'):
    "A copy of the data folder whose `benchmark` file in `lang` has one request changed is refused by loading and by verifying."
    bad = tmp_path/f'data-{lang}'
    shutil.copytree(data_dir(), bad)
    path = bad/benchmark_file(lang, benchmark)
    path.write_text(path.read_text('utf-8').replace('"instruction": "', '"instruction": "hi, ', 1), 'utf-8')
    with pytest.raises(ValueError, match='the benchmark was modified'):
        load_benchmark(catalogs[lang], lang, benchmark, data=bad)
    with pytest.raises(BenchmarkMismatch):
        verify_benchmark(lang, bad, benchmark)


def test_freeform_benchmark(tmp_path, catalogs):
    "The free-form files hold the frozen tasks (same ids and facts) in held-out styles; a modified file is refused."
    for lg in LANGS:
        tpl = read_tasks(data_dir()/benchmark_file(lg))
        ff = read_tasks(data_dir()/benchmark_file(lg, 'freeform'))
        assert [(t.task_id, t.facts) for t in ff] == [(t.task_id, t.facts) for t in tpl]
        assert {t.wording for t in ff} <= {s['id'] for s in wording_styles(lg, 'heldout')}
        assert all(a.instruction != b.instruction for a, b in zip(ff, tpl))
    assert_an_edited_copy_is_refused(tmp_path, catalogs, 'freeform')
    with pytest.raises(ValueError, match='was made for catalog'):  # the unmodified file passes its hash check
        load_benchmark(catalogs['en'], 'en', 'freeform')


def checked_human_benchmark(lang:str):
    """The frozen human benchmark of `lang` and its listed words, checked: the template's tasks (ids and facts), made from
    the requests written by hand, none the template's request, each stating its facts."""
    tpl = read_tasks(data_dir()/benchmark_file(lang))
    human = read_tasks(data_dir()/benchmark_file(lang, 'human'))
    assert [(t.task_id, t.facts) for t in human] == [(t.task_id, t.facts) for t in tpl]
    assert [t.as_dict() for t in human] == [t.as_dict() for t in human_tasks(tpl, human_requests(lang))]
    assert {t.wording for t in human} == {'human'} and all(h.instruction != t.instruction for h, t in zip(human, tpl))
    words = human_words(lang)
    assert {t.task_id: e for t in human if (e := request_problems(t, words))} == {}
    return human, words


def test_human_benchmark(tmp_path, catalogs):
    "The human file holds the frozen tasks (same ids and facts) in the requests written by hand, each stating its facts."
    human, words = checked_human_benchmark('en')
    shoe = human[1]  # 'need loomera AE-937 running shoes in pink, size 42. ...'
    assert request_problems(replace(shoe, instruction=shoe.instruction.replace('AE-937 ', '')), words) == ["model 'AE-937'"]
    assert request_problems(replace(shoe, instruction=shoe.instruction.replace('pink', 'red')), words) == ["option 'pink'"]
    variety = wording_variety(human)
    assert variety['shared_frames'] == {} and variety['openings'] >= 170
    assert_an_edited_copy_is_refused(tmp_path, catalogs, 'human')


def test_human_benchmark_zh(tmp_path, catalogs):
    """The Chinese human file holds the frozen Chinese tasks in requests written by hand, each stating its facts in the
    Chinese catalog's words or words listed for them; a request that drops or loosens a fact is caught."""
    human, words = checked_human_benchmark('zh')
    litter = human[0]  # '...看中了Fetchley的jn-579，要全封闭的那种...预算最多204元...'
    assert request_problems(replace(litter, instruction=litter.instruction.replace('jn-579', '')), words) == ["model 'JN-579'"]
    pillow = human[89]  # '...枕头，大号，一对装...': 大号 only inside 加大号 does not name it
    assert request_problems(replace(pillow, instruction=pillow.instruction.replace('大号', '加大号')), words) == ["option 'large'"]
    assert request_problems(replace(litter, instruction=litter.instruction.replace('204', '240')), words) == \
        ['budget 204', 'money above the budget: [240.0]']
    assert request_problems(replace(litter, instruction=litter.instruction.replace('猫砂盆', '猫窝')), words) == ["category '猫砂盆'"]
    variety = wording_variety(human, 10)
    assert variety['shared_frames'] == {} and variety['openings'] >= 150
    assert_an_edited_copy_is_refused(tmp_path, catalogs, 'human', 'zh')
