"""The shop's veRL agent loop (06a_verl, 06b_verl_agent), tested the way veRL tests its own loops: the loop built from
our agent-loop YAML as a veRL worker builds it, the real SmolLM2 tokenizer and chat template, veRL's dataset class
reading our parquet, and a fake server manager that answers with the expert's turns. The output's ids, masks,
log-probabilities, reward and turn count are compared with the project's runner. Our GRPO overrides are composed with
veRL's own configuration and validated by veRL. The recipe's training reward reaches the loop through the YAML
verl_prepare writes. Needs veRL: `make test` (or `make test-verl` alone) runs this file in .venv-verl; elsewhere it
is skipped."""
from __future__ import annotations
import asyncio, json, sys, types
import pytest

pytest.importorskip('verl.experimental.agent_loop.agent_loop',
                    reason='veRL is not importable in this interpreter; `make test` runs these tests in .venv-verl')

from omegaconf import OmegaConf
from shopping_grpo.episode import ChatRenderer, Episode, load_chat_template, scripted_run
from shopping_grpo.model import materialize_model
from shopping_grpo.grpo import GRPORecipe
from shopping_grpo.verl_loop import (AGENT_NAME, ADVANTAGE_NAME, VerlLaunch, LoopSettings, grpo_overrides,
                                     write_agent_loop_config, write_verl_dataset, verl_prepare, register_advantage)
from _helpers import N_PRODUCTS, SEED, TASK_SEED, LANG


@pytest.fixture(scope='module')
def tok():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(materialize_model('smollm2')))


@pytest.fixture(scope='module')
def renderer(tok): return ChatRenderer(tok, load_chat_template(), LANG)


@pytest.fixture(scope='module')
def verl_dir(shop, shop_dir, renderer, tmp_path_factory):
    "The veRL files of the session shop: train/val parquet and the agent-loop YAML (rollout records kept)."
    d = tmp_path_factory.mktemp('run')/'verl'  # as verl_prepare lays it out: run/verl/
    write_verl_dataset(shop, d, LANG, renderer)
    write_agent_loop_config(LoopSettings(str(shop_dir), N_PRODUCTS, SEED, TASK_SEED, LANG, 'project', 256, 8192, str(d/'rollouts')), d/'agent_loop.yaml')
    return d


def compose(verl_dir, recipe:GRPORecipe, extra=(), launch:VerlLaunch|None=None):
    "veRL's ppo_trainer configuration with our overrides, as `python -m verl.trainer.main_ppo` composes it."
    from hydra import compose as hydra_compose, initialize_config_module
    ov = grpo_overrides(recipe, launch or VerlLaunch(), verl_dir.parent, str(materialize_model('smollm2')))
    with initialize_config_module('verl.trainer.config', version_base=None):
        return hydra_compose(config_name='ppo_trainer', overrides=[*ov, *extra])


class ScriptedServer:
    "A stand-in for veRL's server manager: each episode gets the expert's next turn for its task, with made-up log-probs."
    def __init__(self, solos): self.solos, self.calls = solos, []
    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput
        self.calls.append(dict(request_id=request_id, prompt_ids=list(prompt_ids), sampling_params=dict(sampling_params)))
        solo = next(s for s in self.solos if prompt_ids[:len(s.prompt_ids)] == s.prompt_ids)
        k = sum(c['request_id'] == request_id for c in self.calls) - 1; a, b = solo.turns[k]
        return TokenOutput(token_ids=solo.response_ids[a:b], log_probs=[-(k + 1 + i / 1000) for i in range(b - a)])


async def build_loop(config, server, tok):
    "Our loop as a veRL worker builds it: registry entries from the agent-loop YAML, then hydra.utils.instantiate."
    import hydra
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry, DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset
    for c in OmegaConf.load(config.actor_rollout_ref.rollout.agent.agent_loop_config_path): _agent_loop_registry[c.name] = c
    return hydra.utils.instantiate(_agent_loop_registry[AGENT_NAME], trainer_config=DictConfigWrap(config), server_manager=server,
                                   tokenizer=tok, processor=None, hf_model_type='llama', dataset_cls=RLHFDataset,
                                   data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))


def dataset_rows(config, tok, tmp_path, split='train'):
    "The rows veRL's RLHFDataset makes of our parquet, as the worker passes them to `run` (less agent_name and the dummy tensor)."
    from verl.utils.dataset.rl_dataset import RLHFDataset
    data = OmegaConf.to_container(config.data, resolve=True) | dict(cache_dir=str(tmp_path/'cache'))
    ds = RLHFDataset(config.data[f'{split}_files'], tok, OmegaConf.create(data))
    return [ds[i] for i in range(len(ds))]


def sampling(config):
    "The sampling parameters veRL's worker gives a training rollout."
    r = config.actor_rollout_ref.rollout
    return dict(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, repetition_penalty=1.0, logprobs=r.calculate_log_probs)


@pytest.mark.filterwarnings('ignore:Disabled critic')  # veRL's notice that GRPO needs no critic
def test_overrides_compose_and_validate(verl_dir, monkeypatch):
    "Every override names a key of veRL 0.9.1's configuration, and veRL's own validation accepts the result."
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    cfg = compose(verl_dir, GRPORecipe(resample_rounds=1), ['trainer.logger=[console,wandb]'])
    r = cfg.actor_rollout_ref.rollout
    assert (r.n, r.temperature, r.top_p, r.agent.num_workers, r.multi_turn.max_assistant_turns, r.prompt_length, r.response_length) == (4, 0.7, 0.9, 8, 35, 1280, 6912)
    assert (cfg.actor_rollout_ref.model.lora_rank, cfg.actor_rollout_ref.model.lora_alpha, cfg.actor_rollout_ref.actor.optim.lr) == (16, 32, 2e-5)
    assert (cfg.algorithm.adv_estimator, cfg.actor_rollout_ref.actor.use_kl_loss, cfg.actor_rollout_ref.actor.loss_agg_mode) == ('grpo_trained', False, 'token-mean')
    assert cfg.ray_kwargs.ray_init.runtime_env.worker_process_setup_hook == 'shopping_grpo.verl_loop.register_advantage'
    assert list(cfg.trainer.logger) == ['console', 'wandb'] and cfg.algorithm.filter_groups.enable
    assert (cfg.data.train_batch_size, cfg.actor_rollout_ref.actor.grad_clip, cfg.trainer.total_training_steps, cfg.trainer.save_freq) == (8, 1.0, 50, 10)
    assert not need_reference_policy(cfg) and not need_critic(cfg)  # KL off, GRPO: no reference model, no critic
    from verl.utils.config import omega_conf_to_dataclass
    ck = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor.checkpoint)  # what the checkpoint manager is given
    assert (ck.save_lora_only, cfg.trainer.max_actor_ckpt_to_keep, cfg.trainer.resume_mode) == (True, 1, 'auto')
    assert compose(verl_dir, GRPORecipe(save_every=5)).trainer.save_freq == 5
    # vLLM is not installed on CPU: only its LoRA-rank lookup (the last check) is stood in for
    checked = []
    monkeypatch.setitem(sys.modules, 'verl.workers.rollout.vllm_rollout.utils', types.SimpleNamespace(get_vllm_max_lora_rank=checked.append))
    validate_config(cfg, need_reference_policy(cfg), need_critic(cfg))
    assert checked == [16]


def test_dataset_rows_in_verl(verl_dir, shop, tok, tmp_path):
    "veRL's RLHFDataset reads our parquet: raw_prompt is the episode's opening, agent_name routes to our loop, the id is all the truth."
    rows = dataset_rows(compose(verl_dir, GRPORecipe()), tok, tmp_path)
    assert len(rows) == len(shop.tasks['grpo_train'])
    r = rows[3]; t = shop.tasks['grpo_train'][3]
    assert (r['agent_name'], r['extra_info']['task_id'], r['reward_model']['ground_truth'], r['index']) == (AGENT_NAME, t.task_id, t.task_id, 3)
    assert [m['role'] for m in r['raw_prompt']] == ['system', 'user'] and r['raw_prompt'][1]['content'].startswith(t.instruction)
    assert t.facts.target_asin not in json.dumps(r['raw_prompt'])


def test_expert_episodes_through_fake_server(verl_dir, shop, tok, renderer, tmp_path):
    "The expert's turns, sent through veRL's generate path, give the runner's ids and masks, Reward v3 and veRL's turn count."
    config = compose(verl_dir, GRPORecipe())
    rows = dataset_rows(config, tok, tmp_path)[:8]
    solos = [scripted_run(shop, shop.by_id[r['extra_info']['task_id']], renderer, LANG) for r in rows]
    # an expert episode longer than veRL's response budget ends there as a context overflow (06a_verl): three that fit
    budget = config.actor_rollout_ref.rollout.response_length
    rows, solos = map(list, zip(*[(r, s) for r, s in zip(rows, solos) if len(s.response_ids) < budget][:3]))
    server = ScriptedServer(solos)
    async def play():
        loop = await build_loop(config, server, tok)
        return loop, await asyncio.gather(*[loop.run(sampling(config), **{k: v for k, v in r.items() if k not in ('agent_name', 'dummy_tensor')}) for r in rows])
    loop, outs = asyncio.run(play())
    assert type(loop).__name__ == 'ShoppingAgentLoop' and loop.rollout.max_turns == 35 and loop.rollout.response_length == 6912
    for out, solo in zip(outs, solos):
        assert out.prompt_ids == solo.prompt_ids and out.response_ids == solo.response_ids and out.response_mask == solo.response_mask
        gen = [solo.response_ids[a:b] for a, b in solo.turns]
        assert [t for t, m in zip(out.response_ids, out.response_mask) if m] == sum(gen, [])  # mask 1 exactly on the assistant's turns
        assert all(tok.decode(g).startswith('<tool_call>') and tok.decode(g).endswith('<|im_end|>') for g in gen)
        assert [x for x, m in zip(out.response_logprobs, out.response_mask) if m] == [-(k + 1 + i / 1000) for k, g in enumerate(gen) for i in range(len(g))]
        assert {x for x, m in zip(out.response_logprobs, out.response_mask) if not m} <= {0.0}
        assert out.reward_score == solo.ep.env.reward.reward == 1.0
        assert out.num_turns == len(solo.ep.messages) - 1 == 2 * len(gen)
        assert out.extra_fields['reward_extra_info']['strict_success'] == 1.0 and out.metrics.tool_calls > 0
        assert out.extra_fields['reward_extra_info']['reward_v3'] == 1.0  # the default training reward is Reward v3
        d = out.as_dict()  # veRL's own conversion: the reward sits on the last response token
        assert d['rm_scores'][-1].item() == 1.0 and d['rm_scores'][:-1].abs().sum().item() == 0 and d['responses'].tolist() == solo.response_ids
    # token in, token out: each request carried exactly the ids so far, with our budget and stop token added to veRL's sampling
    for c in server.calls:
        solo = next(s for s in solos if c['prompt_ids'][:len(s.prompt_ids)] == s.prompt_ids)
        assert c['prompt_ids'] in [solo.prompt_ids + solo.response_ids[:a] for a, _ in solo.turns]
        assert c['sampling_params'] == sampling(config) | dict(max_tokens=256, stop_token_ids=[renderer.end_id])
    assert len({c['request_id'] for c in server.calls}) == 3  # one sticky request id per episode
    recs = [json.loads(l) for f in (verl_dir/'rollouts').glob('rollouts-*.jsonl') for l in f.read_text().splitlines()]
    kept = {(r['task_id'], r['reward'], r['termination_reason']) for r in recs}  # each process appends its rollouts' records
    assert all((r['extra_info']['task_id'], 1.0, 'purchase') in kept for r in rows)


def test_limits_from_verl_config(verl_dir, shop, tok, tmp_path):
    "veRL's turn limit and response budget bound the episode: a model that never calls a tool, and one that never stops."
    from verl.workers.rollout.replica import TokenOutput
    class Server:
        def __init__(self, text, stop=True): self.ids = tok.encode(text, add_special_tokens=False) + ([tok.convert_tokens_to_ids('<|im_end|>')] if stop else [])
        async def generate(self, request_id, *, prompt_ids, sampling_params, **kw): return TokenOutput(token_ids=self.ids[:sampling_params['max_tokens']])
    row = dataset_rows(compose(verl_dir, GRPORecipe()), tok, tmp_path)[0]
    kw = {k: v for k, v in row.items() if k not in ('agent_name', 'dummy_tensor')}
    three = kw | dict(raw_prompt=Episode(shop.env(3), shop.by_id[row['extra_info']['task_id']], LANG, 3).messages)  # a row written for 3 turns
    async def play(config, server, kw=kw): return await (await build_loop(config, server, tok)).run(sampling(config), **kw)
    out = asyncio.run(play(compose(verl_dir, GRPORecipe(max_turns=3)), Server('I am not sure what to do.'), three))
    assert (out.reward_score, out.num_turns, out.extra_fields['termination_reason'], out.response_logprobs) == (-0.5, 6, 'max_steps', None)
    assert tok.decode([t for t, m in zip(out.response_ids, out.response_mask) if m]) == 'I am not sure what to do.<|im_end|>' * 3
    out = asyncio.run(play(compose(verl_dir, GRPORecipe(max_context=1280 + 600)), Server('hmm ' * 400, stop=False)))
    assert out.extra_fields['termination_reason'] == 'context_overflow' and out.reward_score == 0.0 and len(out.response_ids) <= 600
    assert out.extra_fields['reward_extra_info']['reward_valid'] == 0.0
    assert sum(out.response_mask) == 0 and out.extra_fields['reward_extra_info']['trained'] == 0.0  # an infrastructure end: not trained on
    d = out.as_dict()  # what veRL's trainer gets: no token of it in the loss
    assert d['response_mask'].sum().item() == 0


def test_stale_dataset_is_refused(verl_dir, tok, tmp_path):
    "A row whose prompt is not this shop's opening for the task (data written for another shop) stops with a clear error."
    config = compose(verl_dir, GRPORecipe())
    row = dataset_rows(config, tok, tmp_path)[0]
    kw = {k: v for k, v in row.items() if k not in ('agent_name', 'dummy_tensor')}
    kw['raw_prompt'] = [dict(m) for m in kw['raw_prompt']]; kw['raw_prompt'][1]['content'] = 'a different request'
    async def play(): return await (await build_loop(config, ScriptedServer([]), tok)).run(sampling(config), **kw)
    with pytest.raises(ValueError, match="is not this shop's opening"): asyncio.run(play())


def test_recipe_reward_reaches_the_loop(shop_dir, shop, tok, tmp_path):
    """GRPORecipe(reward='v3_strict') through verl_prepare: the loop veRL builds from the YAML it writes scores a
    purchase that is not gold (the heuristic shopper opening only its top result) as a graceful stop, with Reward v3
    beside it in reward_extra_info and in the kept trajectory record."""
    import shutil, yaml
    from shopping_grpo.episode import played
    from shopping_grpo.policies import ShopperPolicy
    from shopping_grpo.shoppers import HeuristicShopper
    from shopping_grpo.reward import REWARDS, NON_GOLD_PURCHASES
    run = tmp_path/'run'
    shutil.copytree(shop_dir, run)
    recipe = GRPORecipe(reward='v3_strict')
    launch = VerlLaunch(n_products=N_PRODUCTS, catalog_seed=SEED, task_seed=TASK_SEED, lang=LANG, n_gpus=1)
    rec = verl_prepare(recipe, launch, run)
    written = yaml.safe_load((run/'verl'/'agent_loop.yaml').read_text())[0]
    assert rec['agent_loop']['reward'] == written['reward'] == 'v3_strict'
    config = compose(run/'verl', recipe, launch=launch)
    loop = asyncio.run(build_loop(config, ScriptedServer([]), tok))
    assert loop.rollout.reward == 'v3_strict'
    top1 = ShopperPolicy(HeuristicShopper(n_open=1))
    rows = dataset_rows(config, tok, tmp_path)
    def top1_run(r): return played(shop, shop.by_id[r['extra_info']['task_id']], top1, loop.rollout.renderer, LANG)
    row, solo = next((r, s) for r in rows for s in [top1_run(r)] if s.ep.env.reward.outcome in NON_GOLD_PURCHASES
                     and s.ep.env.reward.reward > REWARDS['graceful_stop'])
    loop.server_manager = ScriptedServer([solo])
    kw = {k: v for k, v in row.items() if k not in ('agent_name', 'dummy_tensor')}
    out = asyncio.run(loop.run(sampling(config), **kw))
    v3 = solo.ep.env.reward.reward
    assert out.response_ids == solo.response_ids and out.reward_score == REWARDS['graceful_stop'] < v3
    assert out.extra_fields['reward_extra_info']['reward_v3'] == v3
    kept = [json.loads(l) for f in (run/'verl'/'rollouts').glob('rollouts-*.jsonl') for l in f.read_text().splitlines()]
    assert [(r['task_id'], r['reward']) for r in kept] == [(row['extra_info']['task_id'], v3)]  # records keep Reward v3



@pytest.mark.filterwarnings('ignore:Disabled critic')
@pytest.mark.parametrize('n_gpus', [1, 2, 4, 8])
def test_recipe_validates_on_n_gpus(verl_dir, monkeypatch, n_gpus):
    """The recipe on N GPUs of one node, as `verl-train --n-gpus N` launches it: veRL's own validation accepts it; a
    step whose episodes do not divide evenly over the GPUs (veRL splits its batch in equal parts, and its validation
    does not check this with dynamic batch sizes) is refused when the command is made."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    monkeypatch.setitem(sys.modules, 'verl.workers.rollout.vllm_rollout.utils', types.SimpleNamespace(get_vllm_max_lora_rank=lambda r: None))
    cfg = compose(verl_dir, GRPORecipe(), launch=VerlLaunch(n_gpus=n_gpus))
    assert (cfg.trainer.n_gpus_per_node, cfg.trainer.nnodes, cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n) == (n_gpus, 1, 32)
    validate_config(cfg, need_reference_policy(cfg), need_critic(cfg))
    odd = GRPORecipe(groups=3, group_size=2)  # 6 episodes a step
    if 6 % n_gpus:
        with pytest.raises(ValueError, match=f'do not divide evenly over {n_gpus} GPUs'):
            compose(verl_dir, odd, launch=VerlLaunch(n_gpus=n_gpus, agent_workers=2))
    else: validate_config(c := compose(verl_dir, odd, launch=VerlLaunch(n_gpus=n_gpus, agent_workers=2)), need_reference_policy(c), need_critic(c))


def test_launch_command_parses_as_veRL_reads_it(verl_dir):
    """The whole command `verl-train` runs, handed to veRL's own entry point with hydra's `--cfg job`: veRL parses every
    override from the command line (lists, the `+` key) and prints the job's configuration without starting anything."""
    import subprocess, yaml
    from shopping_grpo.verl_loop import verl_command
    cmd = verl_command(GRPORecipe(max_steps=20, save_every=5), VerlLaunch(n_gpus=2), verl_dir.parent,
                       str(materialize_model('smollm2')), python=sys.executable)
    p = subprocess.run([*cmd, '--cfg', 'job'], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    job = yaml.safe_load(p.stdout)  # the configuration alone: veRL's notices go to stderr
    t, ck = job['trainer'], job['actor_rollout_ref']['actor']['checkpoint']
    assert (t['n_gpus_per_node'], t['save_freq'], t['max_actor_ckpt_to_keep'], t['resume_mode'], t['logger']) == (2, 5, 1, 'auto', ['console', 'file'])
    assert ck['save_lora_only'] is True and job['data']['train_files'] == str(verl_dir/'train.parquet')


def advantage_batch(left_out_score:float):
    "Two groups of four in veRL's batch form: the score on each response's last token, the third episode of group a not trained on."
    import numpy as np, torch
    from verl import DataProto
    scores = torch.tensor([1.0, 0.0, left_out_score, -0.5, 0.2, 0.2, 0.2, 0.7])
    mask = torch.ones(8, 6); mask[2] = 0; mask[:, 2] = 0  # a page token between two turns
    rewards = torch.zeros(8, 6); rewards[:, -1] = scores
    return DataProto.from_dict(tensors=dict(token_level_rewards=rewards, response_mask=mask),
                               non_tensors=dict(uid=np.array(list('aaaabbbb'), dtype=object)))


def test_advantage_in_verls_compute_advantage():
    """veRL's own `compute_advantage`, with the estimator our overrides name, gives the engine of 06_grpo's group
    advantages: the episode with no trained token is out of its group's mean and standard deviation (its score does
    not matter) and gets 0; the others get (score - mean) / (Bessel std + 1e-4), 0 on untrained tokens."""
    import pytest, torch
    from verl.trainer.ppo.ray_trainer import compute_advantage
    from verl.trainer.config import AlgoConfig
    register_advantage(); register_advantage()  # idempotent
    def advantages(left_out):
        return compute_advantage(advantage_batch(left_out), adv_estimator=ADVANTAGE_NAME, config=AlgoConfig()).batch['advantages']
    adv = advantages(0.0)
    a = torch.tensor([1.0, 0.0, -0.5]); want = (a - a.mean()) / (a.std() + 1e-4)
    assert torch.allclose(adv[[0, 1, 3], -1], want, atol=1e-5) and adv[2].abs().sum() == 0 and adv[:, 2].abs().sum() == 0
    b = torch.tensor([0.2, 0.2, 0.2, 0.7]); assert torch.allclose(adv[4:, -1], (b - b.mean()) / (b.std() + 1e-4), atol=1e-5)
    assert torch.equal(advantages(5.0), adv)  # the left-out score moves nothing
    grpo = compute_advantage(advantage_batch(5.0), adv_estimator='grpo', config=AlgoConfig()).batch['advantages']
    assert not torch.allclose(grpo[[0, 1, 3], -1], want, atol=1e-2)  # veRL's own estimator would count it


def test_ray_workers_register_the_advantage(verl_dir):
    """The setup hook our overrides give Ray (`ray_kwargs.ray_init.runtime_env`, which veRL passes to `ray.init`) runs
    in a fresh worker process: there veRL's registry holds our estimator, as it must in the trainer's worker."""
    import ray
    hook = compose(verl_dir, GRPORecipe()).ray_kwargs.ray_init.runtime_env.worker_process_setup_hook
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, runtime_env=dict(worker_process_setup_hook=hook))
    try:
        @ray.remote
        def estimator_module():
            from verl.trainer.ppo import core_algos
            return core_algos.get_adv_estimator_fn(ADVANTAGE_NAME).__module__
        assert ray.get(estimator_module.remote(), timeout=120) == 'shopping_grpo.verl_loop'
    finally: ray.shutdown()
