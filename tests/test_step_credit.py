"""Step-level credit (06c_step_credit) on the CPU: the progress head's sums, per-token advantages on real episodes,
step groups with a known answer, the head's save and resume, and one engine step of each credit variant with a tiny
model of SmolLM2's architecture."""
from __future__ import annotations
import json
from types import SimpleNamespace
import pytest
import torch

from shopping_grpo.episode import ChatRenderer, played
from shopping_grpo.policies import ExpertPolicy
from shopping_grpo.grpo import CREDITS, credit_advantages, grpo_recipe, train_grpo, read_metrics, rollout_output
from shopping_grpo.step_credit import (DETOURS, collect, REFUSAL_PENALTY, STEP_SPREAD, Detour, Steps, ProgressCredit,
                                       episode_advantages, episode_steps, fit_progress, normalised, progress, progress_head,
                                       step_group_advantages, turn_features, turn_scores)
from test_grpo import SHORT, scripted, adapter_weights, same

torch.set_num_threads(1)


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    from shopping_grpo.sft import tiny_model
    return str(tiny_model(tmp_path_factory.mktemp('tiny')))


@pytest.fixture(scope='module')
def renderer(tiny):
    from transformers import AutoTokenizer
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny), None, 'en')


@pytest.fixture(scope='module')
def group(shop, renderer):
    "A group of four episodes of one task: the expert and its three detours (the expert buys the target)."
    task = next(t for t in shop.tasks['grpo_train'] if played(shop, t, ExpertPolicy(shop.catalog), renderer, max_context=8192).record('e')['strict_success'])
    recs = collect(shop, [task], [ExpertPolicy(shop.catalog), *[Detour(shop.catalog, k) for k in DETOURS]], renderer)
    assert [r['shopper'] for r in recs] == ['expert', *[f'expert+{k}' for k in DETOURS]]
    return recs


def trl_like(recs, end_id):
    "What TRL hands the advantage hook: completions padded to one length, GRPO's episode advantages."
    out = rollout_output(recs, end_id); T = max(map(len, out['completion_ids'])) + 3
    return out, dict(completion_ids=torch.tensor([c + [0] * (T - len(c)) for c in out['completion_ids']]),
                     advantages=torch.tensor(episode_advantages([episode_steps(r) for r in recs], len(recs))))


def test_progress_head_sums_to_its_targets():
    "Fitted on a tiny set, each episode's per-turn values add up to its reward; values differ between turns."
    g = torch.Generator().manual_seed(1)
    feats, rewards = [torch.randn(n, 16, generator=g) * 5 + 3 for n in (4, 1, 6, 3)], [1.0, -0.85, 0.55, -0.35]
    head = progress_head(16, 32, seed=0)
    assert fit_progress(head, feats, rewards, steps=600, lr=1e-2) < 1e-4
    p = progress(head, feats)
    assert [round(float(x.sum()), 2) for x in p] == rewards
    assert float(p[0].std()) > 1e-3 and torch.allclose(head.mu, torch.cat(feats).mean(0))


def test_advantages_are_zero_on_pages_and_constant_within_a_turn(group, renderer, tiny):
    "Both variants on real episodes: 0 on page tokens, padding and invalid episodes; one value per turn = episode advantage + weight x step term."
    from transformers import AutoModelForCausalLM
    rec_out, out = trl_like(group, renderer.end_id)
    spa = credit_advantages('spa', group_size=4, fit_steps=20, weight=0.5); spa.model = AutoModelForCausalLM.from_pretrained(tiny)
    for credit in (spa, credit_advantages('steps', group_size=4, weight=0.5)):
        A = credit(out, group)
        steps = [episode_steps(r) for r in group]
        step_adv = credit.step_advantages(group, steps)[0] if credit is not spa else None
        for i, (r, m) in enumerate(zip(group, rec_out['env_mask'])):
            mask = torch.tensor(m)
            assert (A[i, :len(m)][mask == 0] == 0).all() and (A[i, len(m):] == 0).all()
            for k, (a, b) in enumerate(r['turn_spans']):
                vals = set(A[i, a:b].tolist()); assert len(vals) == 1
                if step_adv is not None: assert abs(vals.pop() - (float(out['advantages'][i]) + 0.5 * step_adv[i][k])) < 1e-5
        assert credit.last['credit_refused_turns'] == 1  # the refused detour
    bad = [dict(r) for r in group]; bad[1] = dict(bad[1], infrastructure_invalid=True)
    _, out2 = trl_like(bad, renderer.end_id)
    assert (credit_advantages('steps', group_size=4)(out2, bad)[1] == 0).all()


def test_step_groups_give_the_known_advantages():
    "Two groups of three; returns compared only within a group and a page; an invalid episode takes no part."
    g1 = [Steps(1.0, True, [(0, 1), (2, 3)], ['home', 'res'], [False, False]),
          Steps(0.0, True, [(0, 1), (2, 3)], ['home', 'res'], [False, False]),
          Steps(None, False, [(0, 1)], ['home'], [False])]
    g2 = [Steps(-0.5, True, [(0, 1), (2, 3), (4, 5)], ['home', 'home', 'res'], [True, False, False]),
          Steps(-0.5, True, [(0, 1), (2, 3)], ['home', 'res'], [False, False]),
          Steps(1.0, True, [(0, 1)], ['other'], [False])]
    adv, info = step_group_advantages(g1 + g2, 3, gamma=0.5, refusal_penalty=0.2)
    # group 1: on 'home' returns 0.5 and 0.0, on 'res' 1.0 and 0.0: each pair normalises to about +-0.707
    home1, res1 = normalised([0.5, 0.0]), normalised([1.0, 0.0])
    assert adv[0] == [home1[0], res1[0]] and adv[1] == [home1[1], res1[1]] and round(home1[0], 3) == 0.707 and adv[2] == [0.0]
    # group 2, gamma 0.5: episode 4 returns -0.2 + 0.5*(0 + 0.5*-0.5) = -0.325 (refused), -0.25, -0.5; episode 5: -0.25, -0.5.
    # On 'home' the spread (0.043) is below the floor: divided by 0.05
    home, res = [(x + 0.275) / (STEP_SPREAD + 1e-4) for x in (-0.325, -0.25, -0.25)], normalised([-0.5, -0.5])
    assert [round(x, 6) for x in adv[3][:2] + adv[4][:1]] == [round(x, 6) for x in home] and adv[3][2] == adv[4][1] == res[0] == 0.0
    assert adv[5] == [0.0] and info == dict(state_groups=4, grouped_turns=9)


def test_turn_scores_mark_the_refused_turn(group):
    "veRL's per-turn scores: the refusal penalty on the refused detour's turn, progress added when given."
    r = group[2]; k = r['detour_turn'] - 1
    assert turn_scores(r) == [-REFUSAL_PENALTY if i == k else 0.0 for i in range(r['n_turns'])]
    assert turn_scores(r, [1.0] * r['n_turns']) == [1.0 - REFUSAL_PENALTY * (i == k) for i in range(r['n_turns'])]


def test_shared_beginnings_give_the_same_features(group, tiny):
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(tiny)
    a, b = turn_features(m, group), turn_features(m, group, share=False)
    assert all(x.shape == (r['n_turns'], 64) and torch.allclose(x, y, atol=1e-4) for x, y, r in zip(a, b, group))


def test_progress_head_resumes_from_the_last_checkpoint(tmp_path):
    "The head and its buffer saved in a checkpoint are what a resumed run binds to; an incomplete checkpoint is not used."
    g = torch.Generator().manual_seed(0); feats = [torch.randn(3, 8, generator=g) for _ in range(4)]
    a = ProgressCredit(fit_steps=30, buffer=3); a.learn(feats, [1.0, 0.0, -0.5, 0.2])
    (tmp_path/'checkpoint-2').mkdir(); (tmp_path/'checkpoint-2'/'trainer_state.json').write_text('{}'); a.save(tmp_path/'checkpoint-2')
    (tmp_path/'checkpoint-3').mkdir()  # cut short: no trainer state
    trainer = SimpleNamespace(model=None, args=SimpleNamespace(num_generations=2, output_dir=str(tmp_path)), callbacks=[])
    trainer.add_callback = trainer.callbacks.append
    b = ProgressCredit(); b.bind(trainer)
    assert b.resumed and len(b.buffer) == 3 and len(trainer.callbacks) == 1 and not (tmp_path/'checkpoint-3').exists()
    assert all(torch.equal(x, y) for x, y in zip(progress(a.head, feats), progress(b.head, feats)))
    assert json.loads((tmp_path/'credit.json').read_text())['credit'] == 'spa'


@pytest.mark.parametrize('credit', CREDITS)
def test_one_engine_step_with_each_credit(shop, tiny, renderer, tmp_path, credit):
    "One GRPO step with the credit variant: it runs, trains, and its run and step records name the variant."
    cfg = grpo_recipe('smoke', **{**SHORT, 'max_steps': 1, 'credit': credit})
    s = train_grpo(tiny, shop, tmp_path/'grpo', cfg, policy_factory=scripted(shop, renderer, cfg))
    tr = [r for r in read_metrics(tmp_path/'grpo'/'metrics.jsonl') if r['kind'] == 'train']
    assert s['final_step'] == 1 and s['recipe']['credit'] == credit and tr[0]['credit'] == credit and tr[0]['skipped'] is None
    assert json.loads((tmp_path/'grpo'/'run.json').read_text())['credit'] == credit
    assert ('credit_step_term' in tr[0]) == (credit != 'episode') and (tmp_path/'grpo'/'credit.json').exists() == (credit != 'episode')
    if credit == 'spa': assert tr[0]['credit_buffer'] == 2 and (tmp_path/'grpo'/'checkpoint-1'/'progress_head.pt').exists()
    if credit == 'steps': assert tr[0]['credit_state_groups'] == 1  # the finisher's and the chatter's turns all stand on the search page
    w = {k: adapter_weights(tmp_path/'grpo'/'val'/f'step-{k}'/'adapter') for k in (0, 1)}
    assert not same(w[0], w[1])
