"""What a DataLoader hands the loop, counted as each batch comes out of its iterator
(sitecustomize._watch_loaders; standalone: the injected sitecustomize imports it from beside
itself, perfswarm from its package): the tensors a worker's pickler hands over for it, and
its samples, where the loader's batch sampler says them.

Neither is in a trace: a collate of its own (torch_geometric's `Batch`, its 11 tensors in
dicts of an object's attributes) leaves no `aten::stack` per field, as default_collate does,
and its first layer's rows are the graphs' nodes (1,674 a step), not its 64 graphs.
"""

from __future__ import annotations

from types import BuiltinFunctionType, FunctionType, MethodType, ModuleType

# Objects looked at in one batch, at most: a batch holding more (a list of a thousand file
# names beside its tensors) counts the tensors found by then
WALK_LIMIT = 1000
# Values that hold no tensor, and objects whose attributes are no batch's data
_LEAVES = (str, bytes, int, float, complex, bool, type(None))
_OPAQUE = (type, ModuleType, FunctionType, BuiltinFunctionType, MethodType)


def batch_tensors(batch: object, tensor: type) -> int:
    """The distinct storages of the tensors (instances of `tensor`, torch.Tensor) `batch`
    holds: walked through tuples, lists, dicts and other objects' attributes (their
    `__dict__`: a dataclass, torch_geometric's Batch and its stores), as pickle walks them,
    each once, at most WALK_LIMIT objects. A worker's pickler hands each storage over once (a
    shared-memory file passed and mapped in, model/receive.py's cost a tensor), however many
    tensors view it; a storage of no bytes goes without a file, and is not counted. A tensor
    without a storage (sparse) counts once."""
    storages: set[int] = set()
    seen: set[int] = set()
    todo = [batch]
    left = WALK_LIMIT
    while todo and left > 0:
        obj = todo.pop()
        left -= 1
        if isinstance(obj, tensor):
            try:
                storage = obj.untyped_storage()  # type: ignore[attr-defined]
                if storage.nbytes():
                    storages.add(storage.data_ptr())
            except (RuntimeError, NotImplementedError):
                storages.add(-id(obj))
        elif not isinstance(obj, _LEAVES) and id(obj) not in seen:
            seen.add(id(obj))
            if isinstance(obj, (list, tuple)):
                todo.extend(obj)
            elif isinstance(obj, dict):
                todo.extend(obj.values())
            elif not isinstance(obj, _OPAQUE) and type(obj).__dictoffset__:
                # (not getattr: a class's __getattr__ may make what it has none of)
                todo.extend(object.__getattribute__(obj, "__dict__").values())
    return len(storages)


def index_samples(index: object) -> int | None:
    """The samples of a batch drawn by its batch sampler's `index` (a list of the dataset's
    indices, one a sample); None where it has no length."""
    try:
        return len(index)  # type: ignore[arg-type]
    except TypeError:
        return None
