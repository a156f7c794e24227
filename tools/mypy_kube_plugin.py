"""A mypy plugin for the tests' type check (``tests/mypy.ini``): kubernetes_asyncio's API
methods as the client really is, not as its stubs say.

kubernetes_asyncio ships ``.pyi`` stubs for its generated API classes that are narrower than
the code in two ways the tests rely on:

* ``body`` is typed as the model class (``create_namespace(body: V1Namespace)``), but the
  client serializes a plain dict as it is (``ApiClient.sanitize_for_serialization``), and the
  tests write their objects as dicts, as the API server stores them;
* ``_content_type`` (the content type of a patch: merge, strategic merge or JSON patch) is an
  accepted keyword of every method (in each method's ``all_params``) but missing from the
  stubs.

So on a call to a method of a class in ``kubernetes_asyncio.client.api``, ``body`` is typed
``Any`` and ``_content_type: str`` is accepted. Every other parameter, the arity and the
return type stay as the stubs have them.
"""

from __future__ import annotations

from collections.abc import Callable

from mypy.nodes import ARG_NAMED_OPT
from mypy.plugin import MethodSigContext, Plugin
from mypy.types import AnyType, FunctionLike, TypeOfAny

_API = "kubernetes_asyncio.client.api."


def _as_the_client_is(ctx: MethodSigContext) -> FunctionLike:
    sig = ctx.default_signature
    arg_types = [
        AnyType(TypeOfAny.special_form) if name == "body" else typ
        for name, typ in zip(sig.arg_names, sig.arg_types, strict=True)
    ]
    arg_kinds, arg_names = list(sig.arg_kinds), list(sig.arg_names)
    if "_content_type" not in arg_names and "_preload_content" in arg_names:
        arg_types.append(ctx.api.named_generic_type("builtins.str", []))
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
