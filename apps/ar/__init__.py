"""The paper's Augmented Reality application, standalone.

Three kinds of processes, as in the CDI paper's AR application (Fig. 2): a *frame
extractor* decodes a video and hands each frame to one of N *object detectors*, which find and
label people in it and hand it to the *frame combinator*, which encodes the output video in
order. The same three roles run over four ways of moving frames (``links``): CDI objects on one
host (``cdi-shm``: a ring of objects sized to the frame, handed back to the extractor for
reuse), raw TCP, REST (HTTP) and gRPC.

* ``apps.ar.config``        what one run is (video, backend, detectors, frames in flight)
* ``apps.ar.links``         the small contract each backend implements, and the backends
* ``apps.ar.roles``         the three roles' loops, written once against that contract, and
                            the two references: the whole application in one process
                            (``floor``) and detection alone in a process pool (``pool``)
* ``apps.ar.role_process``  one role as a program of its own
* ``apps.ar.launch``        starts the roles, wires them, collects their figures
* ``apps.ar.bench``         ``cdiflow bench ar``: every backend side by side
* ``apps.ar.report``        its table and figures
* ``apps.ar.cli``           ``cdiflow ar run|sample`` and ``cdiflow bench ar``
* ``apps.ar.parts``         the optional video and detector libraries, checked
* ``apps.ar.errors``        the exception tree

The image parts (video, detector, sample video, frame layout) are ``workflows.ar``: they
know nothing of processes or transports. This package imports ``cdi`` and ``workflows``,
never ``orchestrator``.
"""
