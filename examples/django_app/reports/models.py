from django.db import models


class Claim(models.Model):
    """A run took a conversation thread (written in the request's transaction)."""

    thread_id = models.CharField(max_length=200)
    run_id = models.CharField(max_length=200)
    fence = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)


class Report(models.Model):
    """One run of the nightly report, with the fence of the lease it ran under."""

    name = models.CharField(max_length=100)
    fence = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
