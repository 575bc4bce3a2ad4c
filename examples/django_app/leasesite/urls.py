from django.urls import path
from reports import views

urlpatterns = [
    path("threads/<str:thread_id>/claim", views.claim_thread),
    path("threads/<str:thread_id>/release", views.release_thread),
]
