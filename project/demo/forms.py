from django import forms

from .runs import MAX_RUN_SIZE

KIND_CHOICES = [
    ("fast", "fast: returns at once"),
    ("slow", "slow: sleeps one second"),
    ("failing", "failing: raises, retried up to 3 attempts"),
    ("emails", "emails: on the emails queue"),
    ("reports", "reports: on the reports queue"),
]


class EnqueueForm(forms.Form):
    count = forms.IntegerField(label="Jobs", min_value=1, max_value=MAX_RUN_SIZE, initial=100)
    kind = forms.ChoiceField(choices=KIND_CHOICES, initial="fast", widget=forms.RadioSelect)
