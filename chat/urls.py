from django.urls import path

from . import views

urlpatterns = [
    path("api/models", views.models_list, name="models"),
]
