"""Per-core selection inside the op: on a CPU with several core types, each
worker of the parallel loop looks up the kernel of its own cluster. A test
hook makes the op run as if on a fake hybrid CPU (ISA limited to this CPU's,
clusters assigned to threads round-robin), so the path runs here too."""
import pytest
import torch

import torchao_kernels as tk

K = torch.ops.torchao_kernels


@pytest.fixture
def fake_cpu():
    def use(name):
        K._set_active_cpu(name)

    yield use
    K._set_active_cpu(None)
    tk.set_overrides()


def _packed(n=512, k=256, bits=4):
    torch.manual_seed(0)
    q, s, z = tk.quantize_weight(torch.randn(n, k), bits, 32, True)
    return tk.pack(q, s, z, bits=bits, group_size=32, target="n16k4"), n, k


@pytest.mark.parametrize("fake", ["alder-lake", "big-little-x2-a710-a510", "zen4", "haswell"])
@pytest.mark.parametrize("m", [1, 3, 40])
def test_fake_hybrid_cpu_gives_identical_results(fake_cpu, fake, m):
    packed, n, k = _packed()
    x = torch.randn(m, k)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        expected = tk.linear(x, packed, 32, n, k)
    finally:
        torch.set_num_threads(threads)
    fake_cpu(fake)
    d = tk.cpu_descriptor()  # the active descriptor now
    assert d["name"].startswith(fake)
    assert set(d["isa"]) <= set(tk.cpu_descriptor("detected")["isa"])
    e = tk.explain(packed, m)
    assert len(e["clusters"]) == len(tk.cpu_descriptor(fake)["clusters"])
    formats = {c["winner"] and tk.info()["kernels"][[k_["name"] for k_ in tk.info()["kernels"]].index(c["winner"])]["format"]
               for c in e["clusters"]}
    assert formats == {"n16k4"}
    tk.reset_stats()
    torch.set_num_threads(2)
    try:
        y = tk.linear(x, packed, 32, n, k)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(y, expected)
    ran = tk.stats()
    winners = {c["winner"] for c in e["clusters"]}
    assert ran and set(ran) <= winners, (ran, winners)


def test_active_cpu_never_exceeds_the_real_isa(fake_cpu):
    fake_cpu("zen4")
    real = set(tk.cpu_descriptor("detected")["isa"])
    assert set(tk.cpu_descriptor()["isa"]) <= real
    for m in (1, 8, 64):
        w = tk.explain("n16k4", m).winner
        need = set(next(k for k in tk.info()["kernels"] if k["name"] == w)["required_isa"])
        assert need <= real
