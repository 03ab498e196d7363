"""Online GRPO (06_grpo) on the CPU with a tiny model of SmolLM2's architecture: the rollout's ids, masks and rewards,
faults inside episodes, NaN steps, per-token advantages, a full disk while checkpointing, and resuming without
repeating or losing a step. The real SmolLM2-135M runs one step in a slow test."""
from __future__ import annotations
import errno, json, math
from pathlib import Path
import pytest
import torch

from shopping_grpo.episode import ChatRenderer, episode_valid
from shopping_grpo.grpo import (GRPORecipe, ShopRollout, DiskFull, grpo_recipe, train_grpo, read_metrics,
                                grpo_monitor, GRPORun, _durable, trim_after)
from _helpers import ScriptedTokens

torch.set_num_threads(1)  # tests share two cores with other work: extra threads only spin


@pytest.fixture(scope='module')
def renderer(tiny):
    from transformers import AutoTokenizer
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny), None, 'en')


class Finisher:
    "Stops at once: Reward v3's early abstain (-0.35), one turn."
    name = 'finisher'
    def reset(self, task): pass
    def reply(self, ep):
        return dict(role='assistant', content='', tool_calls=[dict(id='c', type='function', function=dict(
            name='finish_without_purchase', arguments=json.dumps({'reason': 'nothing fits'})))])


class Chatter:
    "Never calls a tool: the step limit (-0.5)."
    name = 'chatter'
    def reset(self, task): pass
    def reply(self, ep): return 'I am not sure.'


class FlakyShop:
    "The shop, but the first step taken in any training episode (split grpo_train) raises."
    def __init__(self, shop): self.shop, self.hit = shop, False
    def __getattr__(self, k): return getattr(self.shop, k)
    def env(self, max_steps=35):
        env = self.shop.env(max_steps); reset, step = env.reset, env.step
        def flaky(action):
            if not self.hit: self.hit = True; raise OSError('search index unreadable')
            return step(action)
        def reset_(instruction, task):
            if task.split == 'grpo_train': env.step = flaky
            return reset(instruction, task)
        env.reset = reset_; return env


class Stub:
    "What the rollout reads of a trainer."
    def __init__(self, model, step=0): self.model, self.state = model, type('S', (), {'global_step': step})()


SHORT = dict(group_size=2, groups=1, micro_batch=2, max_turns=2, max_new_tokens=16, extra_groups=0, resample_rounds=0, val_every=1, n_val=1, warmup=0, lr=1e-3)


class FinishOn:
    "The finisher on `tasks`, the chatter elsewhere: paired with the finisher, a group of one of `tasks` is flat."
    name = 'finish-on'
    def __init__(self, tasks): self.tasks, self.task = {t.task_id for t in tasks}, None
    def reset(self, task): self.task = task.task_id
    def reply(self, ep): return (Finisher() if self.task in self.tasks else Chatter()).reply(ep)


def scripted(shop, renderer, recipe):
    "A policy factory replaying the finisher and the chatter in turn (two short episodes with different rewards)."
    pol = ScriptedTokens(shop, renderer, shop.tasks['grpo_train'] + shop.tasks['grpo_val'][:recipe.n_val], [Finisher(), Chatter()], 'en', recipe)
    return lambda model, tok, c: pol


def adapter_weights(d):
    from safetensors.torch import load_file
    return load_file(str(Path(d)/'adapter_model.safetensors'))


def same(a, b): return all(torch.equal(a[k], b[k]) for k in a)


def test_rollout_with_the_model_masks_its_own_tokens(shop, tiny, renderer):
    "Sampling from the model (LoRA-wrapped): env_mask is exactly the generated spans; rewards are the episodes' Reward v3."
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny), LoraConfig(r=4, target_modules='all-linear', task_type='CAUSAL_LM'))
    cfg = grpo_recipe('smoke', max_turns=3, max_new_tokens=12)
    ro = ShopRollout(shop, renderer, cfg, shop.tasks['grpo_train'])
    tasks = [t.task_id for t in shop.tasks['grpo_train'][:2] for _ in range(2)]
    out = ro(tasks, Stub(model))
    assert model.training and len(out['completion_ids']) == 4
    for r, m, c in zip(ro.episodes, out['env_mask'], out['completion_ids']):
        assert c == r['response_ids'] and len(m) == len(c)
        assert [i for i, x in enumerate(m) if x] == [i for a, b in r['turn_spans'] for i in range(a, b)]
        assert sum(m) == r['n_generated'] > 0
    assert out['shop_reward'] == [r['reward_detail']['reward'] for r in ro.episodes]
    assert [e['task_id'] for e in out['episode']] == tasks
    st = ro.stats[1]
    assert st['episodes'] == 4 and st['generated_tokens'] == sum(sum(m) for m in out['env_mask']) and st['gen_s'] > 0


def test_faults_end_their_episodes_invalid(shop, renderer):
    "A shop error and a failed generation end their episodes as infrastructure-invalid: reward None, no trained token, counted."
    cfg = grpo_recipe('smoke', **{**SHORT, 'merged_decode': False})  # the stub model has no adapter to merge
    ro = ShopRollout(FlakyShop(shop), renderer, cfg, shop.tasks['grpo_train'], policy_factory=scripted(shop, renderer, cfg))
    out = ro([t.task_id for t in shop.tasks['grpo_train'][:2] for _ in range(2)], Stub(torch.nn.Linear(1, 1)))
    bad = [i for i, r in enumerate(ro.episodes) if not episode_valid(r)]
    assert len(bad) == 1 and ro.episodes[bad[0]]['termination_reason'] == 'env_error' and ro.episodes[bad[0]]['infrastructure_invalid']
    assert out['shop_reward'][bad[0]] is None and sum(out['env_mask'][bad[0]]) == 0 and ro.stats[1]['invalid'] == 1
    assert all(out['shop_reward'][i] is not None and sum(out['env_mask'][i]) > 0 for i in range(4) if i not in bad)
    def broken(model, tok, c):
        def gen(contexts): raise RuntimeError('CUDA error: out of memory')
        return gen
    ro = ShopRollout(shop, renderer, cfg, shop.tasks['grpo_train'], policy_factory=broken)
    out = ro([shop.tasks['grpo_train'][0].task_id] * 2, Stub(torch.nn.Linear(1, 1)))
    assert [r['termination_reason'] for r in ro.episodes] == ['generation_error'] * 2
    assert out['shop_reward'] == [None, None] and ro.stats[1]['invalid'] == 2


def test_nan_step_is_skipped_and_per_token_advantages_train(shop, tiny, renderer, tmp_path):
    "Step 1's advantages are NaN: the weights do not move. Step 2 gets per-token (B x T) advantages through the hook: they do."
    cfg = grpo_recipe('smoke', **{**SHORT, 'max_steps': 2})
    calls = []
    def advantages(out, episodes):
        calls.append(len(episodes)); a = out['advantages']
        if len(calls) == 1: return a * float('nan')
        return a[:, None].expand_as(out['completion_ids']).clone()  # one value per token
    s = train_grpo(tiny, shop, tmp_path/'grpo', cfg, policy_factory=scripted(shop, renderer, cfg), advantage_fn=advantages)
    tr = {r['step']: r for r in read_metrics(tmp_path/'grpo'/'metrics.jsonl') if r['kind'] == 'train'}
    assert calls == [2, 2] and tr[1]['skipped'] == 'nan' and tr[1]['loss'] is None and tr[2]['skipped'] is None
    assert s['skipped_steps'] == {'nan': 1, 'no_signal': 0}
    w = {k: adapter_weights(tmp_path/'grpo'/'val'/f'step-{k}'/'adapter') for k in (0, 1, 2)}
    assert same(w[0], w[1]) and not same(w[1], w[2])
    assert all(torch.isfinite(v).all() for v in w[2].values())



def test_over_sampling_keeps_the_first_varied_groups(shop, renderer):
    """The step's first task is flat: one pass plays it with two extra groups and keeps the step's other task and the first
    varied extra, in play order. The second-pass form gets as far only with a second pass, asking the decoder twice as often."""
    pool = shop.tasks['grpo_train'][:6]; flat = pool[0]
    tasks = [t.task_id for t in pool[:2] for _ in range(2)]
    def rollout(**kw):
        cfg = grpo_recipe('smoke', **{**SHORT, 'groups': 2, 'merged_decode': False, **kw})
        pol = ScriptedTokens(shop, renderer, pool, [Finisher(), FinishOn([flat])], 'en', cfg)
        ro = ShopRollout(shop, renderer, cfg, pool, policy_factory=lambda m, t, c: pol)
        out = ro(tasks, Stub(torch.nn.Linear(1, 1), step=4)); return ro, out
    ro, out = rollout(extra_groups=2)
    ids = [e['task_id'] for e in out['episode']]
    assert ids[0] == ids[1] == pool[1].task_id and ids[2] == ids[3] not in (flat.task_id, pool[1].task_id)
    assert ids == [r['task_id'] for r in ro.episodes] and out['shop_reward'][2] != out['shop_reward'][3]
    st = ro.stats[5]
    assert (st['groups_played'], st['episodes_played'], st['zero_var_share'], st['zero_var_share_final'], st['resample_rounds']) == (4, 8, 0.25, 0.0, 0)
    assert st['decoder_calls'] == 2 and st['decode_steps'] >= st['decoder_calls']  # one pass: the chatter's two turns
    again, _ = rollout(extra_groups=2)
    assert [r['task_id'] for r in again.episodes] == ids  # the extra tasks are drawn by the step's seed
    old, out_old = rollout(extra_groups=0, resample_rounds=1)
    so = old.stats[5]
    assert (so['groups_played'], so['zero_var_share_final'], so['resample_rounds'], so['decoder_calls']) == (3, 0.0, 1, 4)
    assert [e['task_id'] for e in out_old['episode']][2:] == [pool[1].task_id] * 2  # the fresh group stands where the flat one was


def test_merged_copy_follows_the_trained_adapter(shop, tiny, renderer, tmp_path):
    """A step with merged decoding and over-sampled groups: the policy is made on a plain model (no LoRA layers) which,
    after the step, holds the start weights plus the trained adapter; the credit hook sees exactly the rows TRL trains on."""
    from transformers import AutoModelForCausalLM
    from peft import PeftModel
    cfg = grpo_recipe('smoke', **{**SHORT, 'groups': 2, 'extra_groups': 1, 'max_steps': 1})
    assert cfg.merged_decode
    seen, hooked, replay = [], [], scripted(shop, renderer, cfg)
    def factory(model, tok, c): seen.append(model); return replay(model, tok, c)
    def hook(out, episodes):
        hooked.append([(c.tolist(), r['response_ids'], r['task_id']) for c, r in zip(out['completion_ids'], episodes)]); return out['advantages']
    s = train_grpo(tiny, shop, tmp_path/'grpo', cfg, policy_factory=factory, advantage_fn=hook)
    assert s['final_step'] == 1 and len(seen) == 1 and not any('lora' in n for n, _ in seen[0].named_parameters())
    f32 = dict(dtype=torch.float32)
    merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny, **f32), str(tmp_path/'grpo'/'val'/'step-1'/'adapter')).merge_and_unload()
    want, got, start = merged.state_dict(), seen[0].state_dict(), AutoModelForCausalLM.from_pretrained(tiny, **f32).state_dict()
    assert set(want) == set(got) and all(torch.allclose(want[k], got[k], atol=1e-6) for k in want)
    assert any(not torch.equal(start[k], got[k]) for k in start)  # the adapter trained, and the copy moved with it
    assert [len(h) for h in hooked] == [4]
    for h in hooked: assert all(c[:len(r)] == r for c, r, _ in h) and h[0][2] == h[1][2] and h[2][2] == h[3][2]
    tr = [r for r in read_metrics(tmp_path/'grpo'/'metrics.jsonl') if r['kind'] == 'train']
    assert [(r['groups_played'], r['episodes_played'], r['episodes'], r['decoder_calls']) for r in tr] == [(3, 6, 4, 2)]

def test_three_nan_steps_in_a_row_stop(tmp_path):
    "The monitor stops a run whose loss is NaN three steps running, with a clear message."
    mon = grpo_monitor(GRPORun(tmp_path, GRPORecipe(), [], None, None, None))
    lin, state = torch.nn.Linear(2, 1), type('S', (), {'global_step': 0})()
    for i in range(3):
        lin.weight.grad = torch.full((1, 2), float('nan'))
        if i < 2: mon.on_pre_optimizer_step(None, state, None, model=lin); assert lin.weight.grad is None
        else:
            with pytest.raises(FloatingPointError, match='3 steps in a row'): mon.on_pre_optimizer_step(None, state, None, model=lin)


def disk_full_at(monkeypatch, checkpoint:str):
    "Make the Trainer's write of `checkpoint` fail with ENOSPC (after its adapter, before its trainer state); the original method."
    import transformers
    orig = transformers.Trainer._save_rng_state
    def full(self, output_dir):
        if output_dir.endswith(checkpoint): raise OSError(errno.ENOSPC, 'No space left on device', output_dir)
        return orig(self, output_dir)
    monkeypatch.setattr(transformers.Trainer, '_save_rng_state', full)
    return orig


def test_faulty_episode_full_disk_and_resume(shop, tiny, renderer, tmp_path, monkeypatch, caplog):
    """Step 1 has an episode whose shop step raises: it is counted and TRL averages the reward over the valid ones
    (without TRL's per-episode warning in the log). ENOSPC while writing checkpoint-2 stops the run with DiskFull; the
    rerun drops the half checkpoint, resumes from checkpoint-1 past a torn last line of metrics.jsonl (reported), and
    every step is logged once."""
    import transformers, logging
    caplog.set_level(logging.WARNING)
    cfg = grpo_recipe('smoke', **{**SHORT, 'groups': 2, 'max_steps': 2})
    orig = disk_full_at(monkeypatch, 'checkpoint-2')
    out = tmp_path/'grpo'
    with pytest.raises(DiskFull, match='no space left'): train_grpo(tiny, FlakyShop(shop), out, cfg, policy_factory=scripted(shop, renderer, cfg))
    assert (out/'checkpoint-2').is_dir() and not (out/'checkpoint-2'/'trainer_state.json').exists()
    s1 = next(r for r in read_metrics(out/'metrics.jsonl') if r['kind'] == 'train')
    assert s1['step'] == 1 and s1['invalid'] == 1 and s1['episodes'] == 4
    assert math.isclose(s1['trl_reward'], s1['reward_mean'], abs_tol=1e-6)  # TRL's mean is over the three valid episodes
    assert not [r for r in caplog.records if 'reward functions returned None' in r.getMessage()]
    monkeypatch.setattr(transformers.Trainer, '_save_rng_state', orig)
    with open(out/'metrics.jsonl', 'a', encoding='utf-8') as f:
        f.write('{"kind": "train", "step": 2, "lo')  # an append the crash cut short
    with pytest.warns(UserWarning, match=r'metrics\.jsonl:\d+: torn last line'):
        s = train_grpo(tiny, shop, out, cfg, policy_factory=scripted(shop, renderer, cfg))
    assert s['resumed_from'].endswith('checkpoint-1') and s['final_step'] == 2
    recs = read_metrics(out/'metrics.jsonl')
    assert [r['step'] for r in recs if r['kind'] == 'train'] == [1, 2]
    assert [r['step'] for r in recs if r['kind'] == 'val'] == [0, 1, 2]
    assert (out/'merged'/'config.json').exists() and (out/'adapter'/'adapter_model.safetensors').exists()
    again = train_grpo(tiny, shop, out, cfg, policy_factory=scripted(shop, renderer, cfg))  # a finished run, run again
    assert again['resumed_from'].endswith('checkpoint-2') and again['final_step'] == 2  # trains no step more
    assert [r['step'] for r in read_metrics(out/'metrics.jsonl') if r['kind'] == 'train'] == [1, 2]


def test_a_checkpoint_between_validations_is_resumed_from(shop, tiny, renderer, tmp_path, monkeypatch):
    """With save_every=1 and val_every=3 step 1 leaves a checkpoint without a validation; a crash writing checkpoint-2
    resumes from it on the next attempt, which validates once at steps 0 and 3 and logs each step once."""
    import transformers
    cfg = grpo_recipe('smoke', **{**SHORT, 'groups': 2, 'max_steps': 3, 'val_every': 3, 'save_every': 1})
    orig = disk_full_at(monkeypatch, 'checkpoint-2')
    out = tmp_path/'grpo'
    with pytest.raises(DiskFull): train_grpo(tiny, shop, out, cfg, policy_factory=scripted(shop, renderer, cfg))
    assert (out/'checkpoint-1'/'trainer_state.json').exists() and not (out/'val'/'step-1').exists()
    monkeypatch.setattr(transformers.Trainer, '_save_rng_state', orig)
    s = train_grpo(tiny, shop, out, cfg, policy_factory=scripted(shop, renderer, cfg))
    assert s['resumed_from'].endswith('checkpoint-1') and s['final_step'] == 3
    recs = read_metrics(out/'metrics.jsonl')
    assert [r['step'] for r in recs if r['kind'] == 'train'] == [1, 2, 3]
    assert [r['step'] for r in recs if r['kind'] == 'val'] == [0, 3]


def test_a_checkpoint_without_its_optimizer_state_resumes_with_fresh_moments(shop, tiny, renderer, tmp_path, monkeypatch):
    """A run carried without its optimizer state (pack-run --no-optimizer) resumes from its checkpoint with a warning,
    trains each remaining step once, and records the resumption, without optimizer state, in resumes.jsonl and the
    summary."""
    import transformers
    cfg = grpo_recipe('smoke', **{**SHORT, 'groups': 2, 'max_steps': 2, 'val_every': 2, 'save_every': 1})
    orig = disk_full_at(monkeypatch, 'checkpoint-2')
    out = tmp_path/'grpo'
    with pytest.raises(DiskFull): train_grpo(tiny, shop, out, cfg, policy_factory=scripted(shop, renderer, cfg))
    monkeypatch.setattr(transformers.Trainer, '_save_rng_state', orig)
    (out/'checkpoint-1'/'optimizer.pt').unlink()
    with pytest.warns(UserWarning, match="Adam's moments started afresh"):
        s = train_grpo(tiny, shop, out, cfg, policy_factory=scripted(shop, renderer, cfg))
    assert s['final_step'] == 2 and [(r['step'], r['optimizer_state']) for r in s['resumes']] == [(1, False)]
    assert [r['step'] for r in read_metrics(out/'metrics.jsonl') if r['kind'] == 'train'] == [1, 2]


def test_a_fresh_run_drops_what_an_earlier_attempt_wrote(shop, tiny, renderer, tmp_path):
    """A run folder carried from an attempt that stopped before its first checkpoint holds its step-0 validation:
    the fresh run starts over and logs each validation once."""
    cfg = grpo_recipe('smoke', **{**SHORT, 'groups': 2, 'max_steps': 1})
    out = tmp_path/'grpo'
    out.mkdir()
    (out/'metrics.jsonl').write_text(json.dumps(dict(kind='val', step=0, strict_success=0.9, mean_reward=0.9)) + '\n')
    train_grpo(tiny, shop, out, cfg, policy_factory=scripted(shop, renderer, cfg))
    vals = [r for r in read_metrics(out/'metrics.jsonl') if r['kind'] == 'val']
    assert [r['step'] for r in vals] == [0, 1] and vals[0]['strict_success'] != 0.9


def test_broken_metrics_lines_are_skipped_and_reported(tmp_path):
    "read_metrics and trim_after read metrics.jsonl with the one JSONL reader: a corrupt or torn line is reported."
    m = tmp_path/'metrics.jsonl'
    recs = [dict(kind='val', step=0, note='ü'), None, dict(kind='train', step=1), dict(kind='train', step=2)]
    lines = [json.dumps(r, ensure_ascii=False) if r else '{"kind": "tr' for r in recs]  # as append_record writes them
    m.write_text('\n'.join(lines) + '\n{"kind": "val", "st', encoding='utf-8')
    with pytest.warns(UserWarning) as seen: assert [r['step'] for r in read_metrics(m)] == [0, 1, 2]
    assert [str(w.message) for w in seen] == [
        f'{m}:2: corrupt line, task unknown: skipped',
        f'{m}:5: torn last line (a write that did not finish), task unknown: skipped']
    (tmp_path/'val'/'step-2').mkdir(parents=True)
    with pytest.warns(UserWarning) as again: trim_after(tmp_path, 1)
    assert [str(w.message) for w in again] == [str(w.message) for w in seen]
    assert m.read_text(encoding='utf-8') == lines[0] + '\n' + lines[2] + '\n'  # kept records unchanged, byte for byte
    assert not (tmp_path/'val'/'step-2').exists() and read_metrics(tmp_path/'none.jsonl') == []


def test_metrics_write_on_a_full_disk_is_a_clear_stop(tmp_path, monkeypatch):
    import shopping_grpo.grpo as g
    def full(f, rec): raise OSError(errno.ENOSPC, 'No space left on device')
    monkeypatch.setattr(g, 'append_record', full)
    with pytest.raises(DiskFull, match='resumes from its last complete checkpoint'): _durable(tmp_path/'m.jsonl', dict(step=1))


@pytest.mark.slow
def test_real_smollm2_one_step_on_cpu(shop, tmp_path):
    "The embedded SmolLM2-135M, sampled and trained for one step on the CPU (minutes)."
    cfg = grpo_recipe('smoke', group_size=2, groups=1, micro_batch=2, max_steps=1, max_turns=2, max_new_tokens=32, n_val=1)
    s = train_grpo('smollm2', shop, tmp_path/'grpo', cfg)
    tr = [r for r in read_metrics(tmp_path/'grpo'/'metrics.jsonl') if r['kind'] == 'train']
    assert s['final_step'] == 1 and len(tr) == 1 and tr[0]['generated_tokens'] > 0


def test_credit_variants_come_from_the_registry():
    "The engine never imports the step-credit module: its variants are unknown until it is imported, with a clear error."
    import subprocess, sys
    probe = ("import sys\nfrom shopping_grpo.grpo import grpo_recipe\nassert 'shopping_grpo.step_credit' not in sys.modules\n"
             "try: grpo_recipe('gpu', credit='spa')\nexcept ValueError as e: print(e)\n"
             "import shopping_grpo.step_credit\nprint(grpo_recipe('gpu', credit='spa').credit)")
    p = subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    first, last = p.stdout.strip().splitlines()
    assert "unknown credit 'spa'; known: episode" in first and 'import it before starting the run' in first and last == 'spa'


def test_v3_strict_ranks_gold_over_a_stop_over_other_purchases(shop, all_tasks, oracle_records):
    """On real scored episodes (the oracle, heuristic and random shoppers on every task, and the reference SFT and GRPO
    models' benchmark episodes), v3_strict ranks gold > a graceful stop >= any other purchase and keeps every other end."""
    from collections import defaultdict
    from shopping_grpo.episode import run_message_episode
    from shopping_grpo.policies import ShopperPolicy
    from shopping_grpo.shoppers import HeuristicShopper, RandomShopper
    from shopping_grpo.reward import training_reward, REWARDS, NON_GOLD_PURCHASES
    recs = list(oracle_records.values()) + [run_message_episode(shop, t, ShopperPolicy(p))
                                            for p in (HeuristicShopper(), RandomShopper(0)) for t in all_tasks]
    from shopping_grpo.records import read_jsonl
    ref = Path(__file__).resolve().parent.parent/'outputs'/'reference'/'h200'/'eval'
    checks = [c for m in ('sft', 'grpo') for c in read_jsonl(ref/m/'checks.jsonl.gz')[0]]
    by = defaultdict(list)  # outcome -> [(v3, v3_strict)]
    for e in recs + checks:
        by[e['reward_detail']['outcome'] if 'reward_detail' in e else e['outcome']].append(
            (e['reward'], training_reward(e, 'v3_strict')))
    assert {'gold', 'alternative', 'partial', 'wrong_purchase', 'graceful_stop', 'repeat_loop'} <= set(by)
    stop, bought = REWARDS['graceful_stop'], [x for o in NON_GOLD_PURCHASES for x in by[o]]
    assert min(s for _, s in by['gold']) > max(s for _, s in by['graceful_stop']) == stop >= max(s for _, s in bought)
    assert all(s == min(v, stop) for v, s in bought)
    assert any(v > stop for v, _ in bought)  # the cap binds on real episodes
    assert all(s == v for o, xs in by.items() if o not in NON_GOLD_PURCHASES for v, s in xs)


def test_the_recipe_reward_reaches_trl(shop, tiny, renderer, tmp_path, monkeypatch):
    """train_grpo hands TRL the reward function of the recipe's `reward`. On the heuristic shopper's episodes (opening
    only its top result) v3 passes the shop's reward on and v3_strict caps the purchases that are not gold, while
    shop_reward keeps Reward v3."""
    import shopping_grpo.grpo as grpo
    from shopping_grpo.episode import run_lockstep
    from shopping_grpo.policies import ShopperPolicy
    from shopping_grpo.shoppers import HeuristicShopper
    from shopping_grpo.reward import training_reward
    class Built(Exception): "The stand-in trainer has its arguments."
    seen = {}
    def trainer(**kw): seen['reward_funcs'] = kw['reward_funcs']; raise Built
    monkeypatch.setattr(grpo, 'shop_grpo_trainer', lambda: trainer)
    funcs = {}
    for kind in ('v3', 'v3_strict'):
        with pytest.raises(Built):
            train_grpo(tiny, shop, tmp_path/kind, grpo_recipe('smoke', **{**SHORT, 'reward': kind}))
        (funcs[kind],) = seen.pop('reward_funcs')
    assert [f.__name__ for f in funcs.values()] == ['reward_v3', 'reward_v3_strict']
    c, tasks = GRPORecipe(), shop.tasks['grpo_train'][:12]
    script = ScriptedTokens(shop, renderer, tasks, [ShopperPolicy(HeuristicShopper(n_open=1))], 'en', c)
    recs = list(run_lockstep(shop, tasks, script, renderer, 'top1', max_turns=c.max_turns, max_context=c.max_context,
                             max_new_tokens=c.max_new_tokens))
    out = grpo.rollout_output(recs, renderer.end_id)
    v3, strict = (funcs[k](out['completion_ids'], out['shop_reward'], out['episode']) for k in funcs)
    assert v3 == out['shop_reward'] == [r['reward'] if episode_valid(r) else None for r in recs]
    assert strict == [training_reward(r, 'v3_strict') if episode_valid(r) else None for r in recs] != v3
    with pytest.raises(ValueError, match="unknown reward 'v4'; known: v3, v3_strict"): grpo_recipe('smoke', reward='v4')


def test_overflow_reward_trains_the_episodes_that_outgrew_their_context(shop, renderer):
    """With a context too small for some of the heuristic shopper's episodes, those end as context_overflow: under v3
    GRPO leaves them out (no trained token, reward None); under v3_strict_overflow it trains their assistant tokens at
    the step limit's reward, and a group of an overflow and a purchase is no longer flat."""
    import shopping_grpo.grpo as grpo
    from shopping_grpo.episode import run_lockstep
    from shopping_grpo.policies import ShopperPolicy
    from shopping_grpo.shoppers import HeuristicShopper
    from shopping_grpo.reward import REWARDS
    # the heuristic shopper's episodes on these tasks hold 10,000-11,700 tokens of the tiny model's tokenizer
    c, tasks = GRPORecipe(max_context=10500), shop.tasks['grpo_train'][:12]
    script = ScriptedTokens(shop, renderer, tasks, [ShopperPolicy(HeuristicShopper())], 'en', c)
    recs = list(run_lockstep(shop, tasks, script, renderer, 'heuristic', max_turns=c.max_turns, max_context=c.max_context,
                             max_new_tokens=c.max_new_tokens))
    grown = [r['termination_reason'] == 'context_overflow' and sum(r['response_mask']) > 0 for r in recs]
    assert any(grown) and not all(grown), [(r["termination_reason"], len(r["prompt_ids"]) + len(r["response_ids"])) for r in recs]
    outs = {k: grpo.rollout_output(recs, renderer.end_id, k) for k in ('v3', 'v3_strict_overflow')}
    got = {k: grpo.reward_function(k)(o['completion_ids'], o['shop_reward'], o['episode']) for k, o in outs.items()}
    for i, (r, g) in enumerate(zip(recs, grown)):
        if g:
            assert sum(outs['v3']['env_mask'][i]) == 0 and got['v3'][i] is None
            assert outs['v3_strict_overflow']['env_mask'][i] == r['response_mask']
            assert got['v3_strict_overflow'][i] == REWARDS['max_steps']
        else: assert outs['v3']['env_mask'][i] == outs['v3_strict_overflow']['env_mask'][i]
    i, j = grown.index(True), next(k for k, r in enumerate(recs) if episode_valid(r))
    pair = [recs[i], recs[j]]
    assert grpo.flat_groups(pair, 2) == [0] and grpo.flat_groups(pair, 2, 'v3_strict_overflow') == []


def test_released_decoder_rows_train_the_same_steps(shop, tiny, tmp_path):
    """With `release_cache` the rollout decoder frees its rows after each step's episodes (the freed cache is logged)
    and captures them again at the next rollout: two steps train on the same episodes, to the same loss, as with the
    rows held."""
    runs = {}
    for release in (False, True):
        cfg = grpo_recipe('smoke', **{**SHORT, 'max_steps': 2, 'val_every': 2, 'decoder': 'continuous',
                                      'max_context': 1024, 'lockstep_batch': 4, 'release_cache': release})
        train_grpo(tiny, shop, tmp_path/f'grpo-{release}', cfg)
        runs[release] = [r for r in read_metrics(tmp_path/f'grpo-{release}'/'metrics.jsonl') if r['kind'] == 'train']
    assert [r['cache_freed_gib'] for r in runs[False]] == [None, None]
    assert all(r['cache_freed_gib'] > 0 for r in runs[True])
    for k in ('loss', 'reward_mean', 'generated_tokens', 'mean_tokens'):
        assert [r[k] for r in runs[True]] == [r[k] for r in runs[False]], k
