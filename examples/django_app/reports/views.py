"""Claim a conversation thread for a run; a busy thread answers 409 with its holder, so the caller
routes the work to the run that has it.

The acquire commits at once on the provider's own connection, outside the request's transaction
(``ATOMIC_REQUESTS``). If the view fails afterwards, Django rolls back the ``Claim`` row but the
lease stays with the run until its TTL or a release: a retry by the same run acquires it again
with the same fence (an acquire by the current owner is idempotent).
"""

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from .leases import leases
from .models import Claim

THREAD_TTL_MS = 30_000


@csrf_exempt
@require_POST
def claim_thread(request: HttpRequest, thread_id: str) -> JsonResponse:
    run_id = request.POST["run"]
    result = leases.acquire_lease(f"thread:{thread_id}", run_id, ttl_ms=THREAD_TTL_MS)
    if not result.acquired:  # route the work to the holder
        return JsonResponse(
            {"holder": result.owner, "fence": result.fence, "retry_after_ms": result.remaining_ms}, status=409
        )
    Claim.objects.create(thread_id=thread_id, run_id=run_id, fence=result.fence)  # the request's transaction
    return JsonResponse({"owner": run_id, "fence": result.fence})


@csrf_exempt
@require_POST
def release_thread(request: HttpRequest, thread_id: str) -> JsonResponse:
    released = leases.release_lease(f"thread:{thread_id}", request.POST["run"])
    return JsonResponse({"released": released}, status=200 if released else 409)
