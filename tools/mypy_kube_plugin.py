"""A mypy plugin for the tests' type check (``tests/mypy.ini``): kubernetes_asyncio's API
methods as the client really is, not as its stubs say.

kubernetes_asyncio ships ``.pyi`` stubs for its generated API classes that are narrower than
the code in two ways the tests rely on:

* ``body`` is typed as the model class (``create_namespace(body: V1Namespace)``), but the
  client serializes a plain dict as it is (``ApiClient.sanitize_for_serialization``), and the
  tests write their objects as dicts, as the API server stores them;
* ``_content_type`` (the content type of a patch: merge, strategic merge or JSON patch) is an
  accepted keyword of every method (in each method's ``all_params``) but missing from the
  stubs;
* the optional keywords (``_continue``, ``label_selector``, ...) are typed without ``None``,
  but a keyword given as ``None`` is left out of the request (``... is not None`` in each
  method), so a test can pass a continue token that is ``None`` on the first page.

So on a call to a method of a class in ``kubernetes_asyncio.client.api``, ``body`` is typed
``Any``, ``_content_type: str`` is accepted and the optional keywords accept ``None``. The
names of the parameters, the arity and the return type stay as the stubs have them.
"""

from __future__ import annotations

from collections.abc import Callable

from mypy.nodes import ARG_NAMED_OPT, ArgKind
from mypy.plugin import MethodSigContext, Plugin
from mypy.typeops import make_simplified_union
from mypy.types import AnyType, FunctionLike, NoneType, Type, TypeOfAny

_API = "kubernetes_asyncio.client.api."


def _as_taken(name: str | None, kind: ArgKind, typ: Type) -> Type:
    if name == "body":
        return AnyType(TypeOfAny.special_form)
    if kind == ARG_NAMED_OPT:
        return make_simplified_union([typ, NoneType()])
    return typ


def _as_the_client_is(ctx: MethodSigContext) -> FunctionLike:
    sig = ctx.default_signature
    arg_kinds, arg_names = list(sig.arg_kinds), list(sig.arg_names)
    arg_types = [_as_taken(*arg) for arg in zip(arg_names, arg_kinds, sig.arg_types, strict=True)]
    if "_content_type" not in arg_names and "_preload_content" in arg_names:
        str_type = ctx.api.named_generic_type("builtins.str", [])
        arg_types.append(make_simplified_union([str_type, NoneType()]))
        arg_kinds.append(ARG_NAMED_OPT)
        arg_names.append("_content_type")
    return sig.copy_modified(arg_types=arg_types, arg_kinds=arg_kinds, arg_names=arg_names)


class KubeClientPlugin(Plugin):
    def get_method_signature_hook(
        self, fullname: str
    ) -> Callable[[MethodSigContext], FunctionLike] | None:
        return _as_the_client_is if fullname.startswith(_API) else None


def plugin(version: str) -> type[Plugin]:
    return KubeClientPlugin
