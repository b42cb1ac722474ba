"""BindArguments: template parameters become compile-time constants.

Input: the kernel's FunctionIR straight from the bytecode frontend, whose entry block holds
``p = arg(k)`` for every parameter. Output: template parameters are bound to their values
(``p = global(value)``; fields among them are turned into hidden arguments by
ResolveGlobals), runtime parameters are renumbered ``0..m-1``. Never touches other blocks.
"""

from __future__ import annotations


class BindArguments:
    name = "bind_arguments"

    def run(self, state) -> bool:
        ir = state.ir
        changed = False
        runtime_index = {name: i for i, name in enumerate(state.runtime_params)}
        for block in state.func_ir.blocks.values():
            for k, stmt in enumerate(block.body):
                if not (isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Arg)):
                    continue
                pname = stmt.value.name
                if pname in state.template_values:
                    value = state.template_values[pname]
                    block.body[k] = ir.Assign(ir.Global(pname, value, stmt.loc), stmt.target, stmt.loc)
                    changed = True
                elif pname in runtime_index and stmt.value.index != runtime_index[pname]:
                    block.body[k] = ir.Assign(ir.Arg(pname, runtime_index[pname], stmt.loc), stmt.target, stmt.loc)
                    changed = True
        state.refresh_definitions()
        return changed
