from django.urls import path

from . import views

urlpatterns = [
    path("", views.index, name="index"),
    path("orders/<int:order_id>/confirm/", views.confirm_order, name="confirm-order"),
    path("rates/<str:currency>/", views.exchange_rate, name="exchange-rate"),
    path("tasks/<str:task_id>/", views.task_detail, name="task-detail"),
]
