from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("backwave", "0005_forgiven_attempts_and_suspects")]

    operations = [
        # Nullable without a default: adding it rewrites nothing, and a job enqueued outside a
        # trace (or without opentelemetry installed) stores NULL.
        migrations.AddField(
            model_name="job",
            name="trace_context",
            field=models.JSONField(
                blank=True,
                null=True,
                help_text="The W3C trace context of the enqueue (traceparent, tracestate): each attempt's span is its child.",
            ),
        )
    ]
