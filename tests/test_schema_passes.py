"benchmarks/bench_schema_passes.py counts the passes the schema decoder takes: on one row, exactly its `calls`."
import json, sys, tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent/'benchmarks'))


def test_replayed_passes_equal_the_decoders_own_calls():
    from bench_schema_passes import replay
    from shopping_grpo.sft import tiny_model
    from shopping_grpo.generate import SlotDecoder
    from shopping_grpo.judge import Rubric, Requirement, judgment_schema
    from shopping_grpo.local_endpoint import SchemaDecoder
    dec = SlotDecoder(tiny_model(tempfile.mkdtemp(), hidden=64), rows=1, max_context=1024, device='cpu', max_new_tokens=1)
    rub = Rubric('t1', 'en', 'a red comb', [Requirement(f'R{i}', 'feature', [], f'need {i}', 'comb', 'soft') for i in (1, 2)], 'code').freeze()
    schema = judgment_schema(rub, ['a0001', 'e0001', 'a0002', 'a0010', 'e0010'])
    ids = lambda s: tuple(dec.tok.encode(s, add_special_tokens=False))
    for i in range(2):
        prompt = [dec.tok.encode(f'judge episode {i}')]
        calls = {}
        for force in (True, False):
            eng = SchemaDecoder(dec, max_free_tokens=8, force_choices=force)
            answer = eng.answer(prompt, [schema])[0]
            calls[force] = eng.calls  # one row, one request: a pass a decision
        counted = replay(json.dumps(json.loads(answer), ensure_ascii=False), schema, ids)
        assert sum(v for k, v in counted.items() if k.endswith(':forced')) == calls[True]
        assert sum(v for k, v in counted.items() if k.endswith(':every')) == calls[False] > calls[True]
