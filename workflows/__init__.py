"""Image workflows: the task API, the bundled image tasks and workflow definitions.

* ``workflows.api``          ``@task``, ``TaskContext``, ``TaskResult``, ``load_task``, ``run_task``
* ``workflows.imagebuf``     decoded image <-> flat buffer layout; decode/encode of image files
* ``workflows.image_tasks``  ``deblur``, ``denoise``, ``classify``, ``noop``, ``sleep``
* ``workflows.definitions``  workflow/task definition shapes, validation, bundled pipelines
* ``workflows.samples``      synthetic sample images
* ``workflows.ar``           the AR application's parts and the ``ar_video`` tasks (optional
                             ``ar`` dependencies: PyAV, OpenCV)
* ``workflows.errors``       the exception tree (``WorkflowsError``)

This package depends on Pillow and numpy only; it never imports ``orchestrator`` or ``cdi``.
"""
