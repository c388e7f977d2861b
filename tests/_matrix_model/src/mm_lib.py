"""Ops of the matrix model registered the way vLLM and many libraries do
(``torch.library.Library``, not ``custom_op``): each registration API's
implementation lives in a file of its own, which Dynamo never traces."""

import torch
from mm_lib_abstract import ia_abstract
from mm_lib_autograd import rk_backward
from mm_lib_cia import cia_impl
from mm_lib_cpu import dev_cpu, ia_cpu
from mm_lib_define import td_cpu
from mm_lib_fake import rk_fake, td_fake
from mm_lib_kernel import rk_cpu
from mm_lib_meta import dev_meta

lib = torch.library.Library("mml", "DEF")
lib.define("cia(Tensor x) -> Tensor")
lib.impl("cia", cia_impl, "CompositeImplicitAutograd")
lib.define("dev(Tensor x) -> Tensor")
lib.impl("dev", dev_cpu, "CPU")
lib.impl("dev", dev_meta, "Meta")
lib.define("rk(Tensor x) -> Tensor")
torch.library.register_kernel("mml::rk", "cpu", rk_cpu, lib=lib)
lib._register_fake("rk", rk_fake)
torch.library.register_autograd("mml::rk", rk_backward, lib=lib)
lib.define("ia(Tensor x) -> Tensor")
lib.impl("ia", ia_cpu, "CPU")
torch.library.impl_abstract("mml::ia", ia_abstract, lib=lib)
torch.library.define("mml::td", "(Tensor x) -> Tensor", lib=lib)
torch.library.impl("mml::td", "cpu", td_cpu, lib=lib)
torch.library.register_fake("mml::td", td_fake, lib=lib)


def apply(x: torch.Tensor) -> torch.Tensor:
    ops = torch.ops.mml
    y: torch.Tensor = ops.td(ops.ia(ops.rk(ops.dev(ops.cia(x)))))
    return y
