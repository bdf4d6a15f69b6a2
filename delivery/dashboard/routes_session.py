"""Sign in (an account key or the operator key) and sign out."""

from __future__ import annotations

from aiohttp import web

from delivery.dashboard import csrf, pages, session as sessions

routes = web.RouteTableDef()


def home_of(session: sessions.Session) -> str:
    return f"{pages.PREFIX}/operator" if session.is_operator else f"{pages.PREFIX}/overview"


def _sign_in_page(request: web.Request, *, error: str | None = None, status: int = 200) -> web.Response:
    token = csrf.new_sign_in_token()
    response = pages.render(request, "sign_in.html", {"sign_in_token": token, "error": error}, status=status)
    sessions.set_cookie(response, request, csrf.SIGN_IN_COOKIE, token, path=csrf.SIGN_IN_COOKIE_PATH,
                        max_age=csrf.SIGN_IN_SECONDS)
    return response


@routes.get("/")
async def index(request: web.Request) -> web.Response:
    raise pages.redirect(home_of(pages.current(request)))


@routes.get("/sign-in")
async def sign_in_form(request: web.Request) -> web.Response:
    existing = await sessions.lookup(pages.api(request).pool, request)
    if existing is not None:
        raise pages.redirect(home_of(existing))
    return _sign_in_page(request)


@routes.post("/sign-in")
async def sign_in(request: web.Request) -> web.Response:
    form = await request.post()
    if not csrf.same_origin(request) or not csrf.matches(request.cookies.get(csrf.SIGN_IN_COOKIE),
                                                         form.get(csrf.FIELD)):
        return _sign_in_page(request, error="The sign-in form expired or came from another site; try again.",
                             status=403)
    key = form.get("key")
    ctx = pages.api(request)
    session = await sessions.sign_in(ctx.pool, key.strip() if isinstance(key, str) else "", ctx.auth.is_operator)
    if session is None:
        return _sign_in_page(request, error="That key is not valid (or was revoked).", status=401)
    response = web.HTTPSeeOther(home_of(session))
    sessions.set_cookie(response, request, sessions.COOKIE_NAME, session.token)
    sessions.clear_cookie(response, request, csrf.SIGN_IN_COOKIE, csrf.SIGN_IN_COOKIE_PATH)
    raise response


@routes.post("/sign-out")
async def sign_out(request: web.Request) -> web.Response:
    await sessions.sign_out(pages.api(request).pool, pages.current(request))
    response = web.HTTPSeeOther(f"{pages.PREFIX}/sign-in")
    sessions.clear_cookie(response, request)
    raise response
