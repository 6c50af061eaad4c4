"""Line renderers for people: typed on the model they print, yielding lines, never printing."""
