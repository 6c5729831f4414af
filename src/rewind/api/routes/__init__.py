"""The API's route modules, one :class:`fastapi.APIRouter` (``router``) each; a route receives
the server's context through the ``ctx: Ctx`` dependency (:mod:`rewind.api.context`)."""
