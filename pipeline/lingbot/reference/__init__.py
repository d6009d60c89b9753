"""The built-in reference world model: real torch stages with LingBot's shapes and chunk contract, no weights
(`model`), with its picture side (`picture`: colour, latent packing, the built-in scene), its camera geometry
(`geometry`: rays, the panorama and the ground, the band layout of a sharded denoiser), and how it reads a prompt
(`looks`)."""
