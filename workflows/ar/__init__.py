"""The Augmented Reality application's image parts, free of processes and transports.

* ``workflows.ar.video``     decode and encode through PyAV (FFmpeg inside the wheel)
* ``workflows.ar.detector``  OpenCV's HOG people detector and labelled boxes
* ``workflows.ar.framebuf``  one frame, its boxes and its header as a flat message
* ``workflows.ar.sample``    the generated sample video (people-like figures walking)
* ``workflows.ar.figures``   the walking figures it draws
* ``workflows.ar.threads``   OpenCV on one thread
* ``workflows.ar.tasks``     the tasks of the bundled ``ar_video`` workflow

Needs the optional ``ar`` dependencies (PyAV, OpenCV).
"""
